"""The wrapper functions the wrapt proxies call: one per row role, built from the table.

Hot path: with no recorder open and no capture in progress (``state.demand`` false) a wrapper
calls the original at once. Otherwise it derives the launch metadata, enters the annotation
context around the original, and never lets a failure of its own reach the caller.
"""

from __future__ import annotations

import sys
from _thread import get_ident
from collections.abc import Callable
from typing import Any, NamedTuple

from autoannot import groups, metadata, sites
from autoannot import vocabulary as V
from autoannot.annotation import AnnotationContext
from autoannot.collectives import C10D, OPS, Collective, Role
from autoannot.diagnostics import warn_once
from autoannot.records import Record, enter, new_record, publish
from autoannot.sites import call_site

_getframe = sys._getframe
Wrapper = Callable[[Callable[..., Any], Any, tuple, dict], Any]

# The frames of this module are marked ``__tracebackhide__`` (pytest, IPython and others leave
# them out of the tracebacks they show): an exception raised by a collective the agent
# annotated reads as it does with the agent off.


def call_as_one_launch(state: Any, wrapped: Callable[..., Any], args: tuple,
                       kwargs: dict) -> Any:
    """Run a call whose launch is annotated here: wrapped calls inside it (``state.inside``)
    and the observers below it take it for the same launch (``state.exclusion``: the native
    observer leaves it alone; the Python layer's key is excluded around it, so the launch does
    not also pass through a Python kernel below, ~7 us of boxing for nothing)."""
    __tracebackhide__ = True
    inside = state.inside
    ident = get_ident()
    depth = inside.get(ident, 0)
    inside[ident] = depth + 1
    exclusion = state.exclusion
    try:
        if exclusion is None:
            return wrapped(*args, **kwargs)
        if exclusion[2] is not None:
            return exclusion[2](wrapped, args, kwargs)
        exclusion[0](exclusion[1], True)
        try:
            return wrapped(*args, **kwargs)
        finally:
            exclusion[0](exclusion[1], False)
    finally:
        if depth:
            inside[ident] = depth
        else:
            del inside[ident]


def _run_annotated(
    state: Any, label: str, ctx: AnnotationContext, wrapped: Callable[..., Any], args: tuple,
    kwargs: dict
) -> Any:
    __tracebackhide__ = True
    try:
        ctx.__enter__()
        entered = True
    except Exception as exc:
        warn_once(label, "entering the annotation context", exc)
        entered = False
    if not entered:  # outside the except block: the caller's exception carries none of ours
        result = call_as_one_launch(state, wrapped, args, kwargs)
        if state.recorders:  # it launched: recorded as any launch, though not annotated
            try:
                publish(state, new_record(label, ctx.annotation,
                                          ctx.call_site or call_site(2), ctx.cpu_only),
                        ctx.python_api)
            except Exception as exc:
                warn_once(label, "recording", exc)
        return result
    try:
        result = call_as_one_launch(state, wrapped, args, kwargs)
    except BaseException as exc:
        try:
            ctx.__exit__(type(exc), exc, exc.__traceback__)
        except Exception as own:
            warn_once(label, "leaving the annotation context", own)
        raise
    try:
        ctx.__exit__(None, None, None)
    except Exception as exc:
        warn_once(label, "leaving the annotation context", exc)
    return result


def _run_unannotated(
    state: Any, label: str, why: BaseException, wrapped: Callable[..., Any], args: tuple,
    kwargs: dict
) -> Any:
    """The metadata could not be derived: run the call (the same launch: not annotated again
    by an observer below); if it succeeds, say so once."""
    __tracebackhide__ = True
    result = call_as_one_launch(state, wrapped, args, kwargs)
    warn_once(label, "deriving the collective metadata", why)
    return result


#: Launches kept per wrapped function (training repeats the same few launches, each step).
CACHE_SIZE = 4096


class Known(NamedTuple):
    """What the agent attaches to one kind of launch, built once and shared by every launch
    of that kind (read-only: never mutate its dicts)."""

    annotation: dict[str, Any]
    cpu_only: dict[str, Any]  # the CPU op's own keys ("Rank", ...)
    launch: metadata.Launch  # its facts (``.kernels``: the NCCL kernel families it may run)


def launch_wrapper(row: Collective, plan: metadata.Plan, agent: Any,
                   holds_data: Callable[[tuple, dict], bool] | None = None) -> Wrapper:
    """The wrapper of a function that launches one collective, reporting to ``agent`` (the
    ``Instrumentation``: its ``state`` and ``captures``).

    A launch seen before is found by its key (``Plan.key_of``: the group's id, tensor dtypes
    and sizes, read straight from the arguments); a new one is derived in full, once.

    ``holds_data``: this wraps a dispatcher kernel's redispatch, which goes below the agent's
    key, and a launch not found by its key is annotated only if ``holds_data(args, kwargs)``
    says its tensors hold data (the kernels' own test)."""
    label = row.label
    derive = plan.derive
    by_key = groups.id_keyed()  # launch key -> Known
    by_facts: dict[tuple, Known] = {}  # launches without a key: by their derived facts
    new_tuple = tuple.__new__  # NamedTuple's own constructor parses its arguments
    call_sites = sites.SITES
    state = agent.state
    calls = state.calls
    inside = state.inside  # thread ident -> depth, for the threads inside a wrapped call
    note_in_ledger = agent.captures.note
    # Exclude our key around the call: a proxy's call, and a compiled op's redispatch (torch's
    # _c10d_functional kernels launch a c10d:: op, where a kernel of ours would be called again,
    # ~7 us to be let through); a c10d:: op's redispatch launches nothing of ours below.
    excludes = holds_data is None or row.module == OPS
    python_api = holds_data is None  # (a dispatcher kernel's launch is below the Python API)

    def learn(args: tuple, kwargs: dict, key: tuple | None) -> Known:
        """Derive a launch not seen before (raises what deriving raises)."""
        if holds_data is not None and not holds_data(args, kwargs):
            raise metadata.NotALaunch
        launch = derive(args, kwargs)
        facts = launch[1:9]  # group facts (by identity), sizes, dtype, splits, ranks
        known = by_facts.get(facts)
        if known is None:
            if len(by_facts) >= CACHE_SIZE:
                by_facts.clear()
            known = by_facts[facts] = new_tuple(Known, (
                metadata.annotation_of(label, launch), metadata.cpu_only_args(launch),
                launch))
        if key is not None:
            if len(by_key) >= CACHE_SIZE:
                by_key.clear()
            by_key[key] = known
        return known

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        __tracebackhide__ = True
        if not state.demand:  # nothing to annotate
            return wrapped(*args, **kwargs)
        ident = get_ident()
        if ident in inside:  # inside a wrapped call: its launch
            return wrapped(*args, **kwargs)
        why: Exception | None = None
        try:
            key = plan.key_of(args, kwargs)
            known = by_key.get(key)  # (None is never a key)
            if known is None:
                known = learn(args, kwargs, key)
        except metadata.NotALaunch:  # meta or fake tensors: tracing, nothing runs
            known = None
        except Exception as exc:
            known, why = None, exc
        # The call runs outside the except blocks: its own exception carries none of ours.
        if known is None:
            if why is None:
                return call_as_one_launch(state, wrapped, args, kwargs)
            return _run_unannotated(state, label, why, wrapped, args, kwargs)
        site = None
        in_capture = False
        if state.before_launch:  # a block, capture or journal open (one test for the three)
            if state.blocks and calls.blocks:  # in a _coalescing_manager block: the launch
                calls.blocks[-1].launches.append(known.launch)
                return call_as_one_launch(state, wrapped, args, kwargs)
            if state.captures:  # the capture's ledger (below), or torch's mark_kernels
                if agent.captures.torch_marks is not None:
                    ctx = AnnotationContext(label, known.annotation, known.cpu_only,
                                            known.launch.kernels, agent=agent,
                                            python_api=python_api)
                    return _run_annotated(state, label, ctx, wrapped, args, kwargs)
                in_capture = True
            if state.journals:  # written before the call: a collective that hangs is in it
                site = call_site(2)  # from our caller
                enter(state, new_record(label, known.annotation, site, known.cpu_only))
        # call_as_one_launch, inlined (see there): this is the path that annotates
        inside[ident] = 1
        exclusion = state.exclusion if excludes else None
        if exclusion is None:
            try:
                result = wrapped(*args, **kwargs)
            finally:
                del inside[ident]
        elif exclusion[2] is not None:  # the native observer's one call
            try:
                result = exclusion[2](wrapped, args, kwargs)
            finally:
                del inside[ident]
        else:
            set_excluded, dispatch_key, _ = exclusion
            set_excluded(dispatch_key, True)
            try:
                result = wrapped(*args, **kwargs)
            finally:
                set_excluded(dispatch_key, False)
                del inside[ident]
        if in_capture:  # into its graph's ledger, once launched (a call that raised has not)
            _note_in_ledger(note_in_ledger, label, known, site)
        recorders = state.recorders
        if recorders:  # after the call: a launch that raised is not recorded
            if site is None:  # our caller's line, where it is the user's (mostly), else found
                frame = _getframe(1)
                code = frame.f_code
                known_sites = call_sites.get(id(code))  # (see sites.SITES)
                lines = known_sites[1] if known_sites and known_sites[0] is code else None
                site = lines.get(frame.f_lasti) if lines else None
                if site is None:
                    site = call_site(2)
            entry = new_tuple(Record, (label, known[0], site, known[1]))
            for recording in recorders:
                if python_api or not recording.python_api_only:
                    recording.append(entry)
        return result

    def known_for(args: tuple, kwargs: dict) -> Known:
        """The launch's Known, by its key (derived the first time; raises what deriving
        raises). The wrapper above does the same inline: its hot path."""
        key = plan.key_of(args, kwargs)
        known = by_key.get(key)  # (None is never a key)
        return known if known is not None else learn(args, kwargs, key)

    def note_in_capture(args: tuple, kwargs: dict, site: str) -> None:
        """A launch handed to the native observer that it did not note (its process group
        made no record of it): into the capture's ledger as the wrapper above notes it, after
        the call."""
        try:
            known = known_for(args, kwargs)
        except metadata.NotALaunch:  # meta or fake tensors: tracing, nothing runs
            return
        except Exception as exc:
            warn_once(label, "deriving the collective metadata", exc)
            return
        _note_in_ledger(note_in_ledger, label, known, site)

    def noted_as(args: tuple, kwargs: dict) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        """What a launch is noted as in its graph's ledger, ``(annotation, kernels)``, for the
        native observer's C wrapper, which keys calls as ``plan.key_of`` does and asks once
        per key; None where nothing is derived (the wrapper then runs, and says why)."""
        try:
            known = known_for(args, kwargs)
        except Exception:
            return None
        return known.annotation, known.launch.kernels

    wrapper.note_in_capture = note_in_capture  # type: ignore[attr-defined]
    wrapper.noted_as = noted_as  # type: ignore[attr-defined]
    return wrapper


def _note_in_ledger(note: Callable[..., None], label: str, known: Known,
                    site: str | None) -> None:
    """A launch made in a capture, into its graph's ledger (``note`` finds the call site where
    ``site`` is None; a failure is said once, the launch stands)."""
    try:
        note(label, known.annotation, known.launch.kernels, site)
    except Exception as exc:
        warn_once(label, "noting the launch in its graph's ledger", exc)


class CoalescingBlock:
    """Stands in for ``_coalescing_manager(...)``: the calls inside are one launch."""

    def __init__(self, manager: Any, label: str, agent: Any) -> None:
        self._manager = manager
        self._label = label
        self._agent = agent
        self.launches: list[metadata.Launch] = []

    def __enter__(self) -> Any:
        value = self._manager.__enter__()
        state = self._agent.state
        state.calls.blocks.append(self)
        state.block_opened(True)
        return value

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        __tracebackhide__ = True
        state = self._agent.state
        state.calls.blocks.remove(self)
        state.block_opened(False)
        if exc_type is not None or not self.launches:
            return self._manager.__exit__(exc_type, exc, tb)
        try:
            ctx: AnnotationContext | None = self._context()
        except Exception as own:
            warn_once(self._label, "deriving the collective metadata", own)
            ctx = None
        if ctx is None:  # outside the except block: the block's exception carries none of ours
            return self._manager.__exit__(None, None, None)
        return _run_annotated(state, self._label, ctx, self._manager.__exit__,
                              (None, None, None), {})

    def _context(self) -> AnnotationContext:
        launch = metadata.coalesced(self.launches)
        if launch is not None:
            annotation = metadata.annotation_of(self._label, launch)
            cpu_only = metadata.cpu_only_args(launch)
        else:  # point-to-point or mixed: eager gives this kernel no collective args
            lane = self.launches[0].facts.lane
            annotation, cpu_only = {V.NAME: self._label, V.STREAM: lane}, {}
        kernels = tuple(sorted({k for launch in self.launches for k in launch.kernels}))
        return AnnotationContext(self._label, annotation, cpu_only, kernels, agent=self._agent)


def block_wrapper(row: Collective, plan: metadata.Plan, agent: Any) -> Wrapper:
    """The wrapper of ``_coalescing_manager``."""
    state = agent.state

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        __tracebackhide__ = True
        manager = wrapped(*args, **kwargs)
        if not state.demand or get_ident() in state.inside:
            return manager
        label = state.calls.batch_label or row.api
        return CoalescingBlock(manager, label, agent)

    return wrapper


def _current_p2p_functions(proxies: Any) -> dict[Any, Any]:
    """Map isend/irecv, original or proxy, to the object c10d's module holds now."""
    c10d = sys.modules[C10D]  # torch's (imported: batch_isend_irecv was called)
    mapping: dict[Any, Any] = {}
    for name in ("isend", "irecv"):
        current = getattr(c10d, name)
        original = getattr(current, "__wrapped__", current)
        mapping[id(original)] = current
        proxy = proxies.get(original)
        if proxy is not None:
            mapping[id(proxy)] = current
    return mapping


def normalize_p2p_ops(ops: Any, proxies: Any) -> Any:
    """P2POps built before ``enable()`` (or after ``disable()``) name another isend/irecv object
    than c10d's module does now; torch tests ``op.op is isend``. Hand it copies that match."""
    if not isinstance(ops, list | tuple):
        return ops
    mapping = _current_p2p_functions(proxies)
    fixed = list(ops)
    changed = False
    for i, op in enumerate(ops):
        function = getattr(op, "op", None)
        current = mapping.get(id(function))
        if current is not None and current is not function:
            clone = object.__new__(type(op))  # P2POp.__new__ wants the constructor's args
            clone.__dict__.update(op.__dict__)
            clone.op = current
            fixed[i] = clone
            changed = True
    return fixed if changed else ops


def batch_wrapper(row: Collective, plan: metadata.Plan, agent: Any) -> Wrapper:
    """The wrapper of ``batch_isend_irecv``: labels the launches made inside it."""
    state, proxies = agent.state, agent.proxies

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        __tracebackhide__ = True
        try:
            if args:
                args = (normalize_p2p_ops(args[0], proxies), *args[1:])
            elif "p2p_op_list" in kwargs:
                kwargs = {**kwargs,
                          "p2p_op_list": normalize_p2p_ops(kwargs["p2p_op_list"], proxies)}
        except Exception as exc:
            warn_once(row.label, "matching P2POp functions", exc)
        if not state.demand:
            return wrapped(*args, **kwargs)
        calls = state.calls
        previous, calls.batch_label = calls.batch_label, row.label
        try:
            return wrapped(*args, **kwargs)
        finally:
            calls.batch_label = previous

    return wrapper


WRAPPER_FACTORIES: dict[Role, Callable[[Collective, metadata.Plan, Any], Wrapper]] = {
    Role.LAUNCH: launch_wrapper,
    Role.BLOCK: block_wrapper,
    Role.BATCH: batch_wrapper,
}

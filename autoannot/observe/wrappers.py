"""The wrapper functions the wrapt proxies call: one per row role, built from the table.

Hot path: with no recorder open and no capture in progress (``state.demand`` false) a wrapper
calls the original at once. Otherwise it finds the launch's kind (derived once), runs the
original as one launch and hands it where the sink's rule says (``keep.sink``: inline for
recorders and captures, ``Sink.run`` for the rest), and never lets a failure of its own reach
the caller.
"""

from __future__ import annotations

import sys
from _thread import get_ident
from collections.abc import Callable
from typing import Any

from autoannot.base.diagnostics import warn_once
from autoannot.describe import metadata, sites
from autoannot.describe import vocabulary as V
from autoannot.describe.collectives import C10D, OPS, Collective, Role
from autoannot.describe.kinds import Kind, Kinds, kind_of
from autoannot.describe.sites import call_site, site_from
from autoannot.keep.records import Record
from autoannot.keep.sink import LaunchEvent

_getframe = sys._getframe
Wrapper = Callable[[Callable[..., Any], Any, tuple, dict], Any]

# The frames of this module are marked ``__tracebackhide__`` (pytest, IPython and others leave
# them out of the tracebacks they show): an exception raised by a collective the agent
# annotated reads as it does with the agent off.


class Exclusion:
    """How a wrapper runs the call it annotates so that no observer below annotates it again:
    ``call(function, args, kwargs)`` does it (the native observer's), or else a dispatch key is
    excluded around it (``set_excluded(key, True)``, then ``False``: the Python layer's)."""

    __slots__ = ("call", "key", "set_excluded")

    def __init__(self, set_excluded: Any = None, key: Any = None, call: Any = None) -> None:
        self.set_excluded = set_excluded
        self.key = key
        self.call = call


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
        claimed, set_excluded = exclusion.call, exclusion.set_excluded
        if claimed is not None:
            return claimed(wrapped, args, kwargs)
        set_excluded(exclusion.key, True)
        try:
            return wrapped(*args, **kwargs)
        finally:
            set_excluded(exclusion.key, False)
    finally:
        if depth:
            inside[ident] = depth
        else:
            del inside[ident]


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


def _rings_returned(rings: tuple[Any, ...], failed: bool, result: Any = None) -> None:
    """Tell the rings the launch returned ``result`` (or raised); a failure of theirs is said
    once."""
    try:
        for ring in rings:
            ring.returned(failed, result)
    except Exception as exc:
        warn_once("ring", "writing the launch's end to the ring", exc)


#: The wrappers made from now on annotate inline, as below (True), or hand every launch to the
#: sink to run (False: the test that holds the inline path to the sink's rule, launch for
#: launch, compares the two).
INLINE = True


def launch_wrapper(row: Collective, plan: metadata.Plan, agent: Any,
                   holds_data: Callable[[tuple, dict], bool] | None = None) -> Wrapper:
    """The wrapper of a function that launches one collective, reporting to ``agent`` (the
    ``Instrumentation``: its ``state`` and ``captures``).

    A launch seen before is found by its key (``Plan.key_of``: the group's id, tensor dtypes
    and sizes, read straight from the arguments); a new one is derived in full, once, and its
    ``Kind`` shared by every key whose launch has the same facts.

    The launches it annotates go where ``keep.sink``'s rule sends them. The common ones (a
    recorder open, a capture in progress) are done here inline, the hot path: the graph's ledger
    and the recorders after the call. The others (a record file open, torch's own annotations
    in a capture) the sink runs whole (``Sink.run``).

    ``holds_data``: this wraps a dispatcher kernel's redispatch, which goes below the agent's
    key, and a launch not found by its key is annotated only if ``holds_data(args, kwargs)``
    says its tensors hold data (the kernels' own test)."""
    label = row.label
    derive = plan.derive
    kinds = Kinds()  # launch key -> its Kind
    by_key = kinds.by_key  # (its dict: read on the hot path)
    by_facts = Kinds()  # a launch's facts -> its Kind (one Kind for keys alike in them)
    new_tuple = tuple.__new__  # NamedTuple's own constructor parses its arguments
    call_sites = sites.SITES
    state = agent.state
    calls = state.calls
    inside = state.inside  # thread ident -> depth, for the threads inside a wrapped call
    note_in_ledger = agent.captures.note  # (a capture's ledger, as the sink notes it)
    # Exclude our key around the call: a proxy's call, and a compiled op's redispatch (torch's
    # _c10d_functional kernels launch a c10d:: op, where a kernel of ours would be called again,
    # ~7 us to be let through); a c10d:: op's redispatch launches nothing of ours below.
    excludes = holds_data is None or row.module == OPS
    python_api = holds_data is None  # (a dispatcher kernel's launch is below the Python API)
    sink = agent.sink

    def learn(args: tuple, kwargs: dict, key: tuple | None) -> Kind:
        """Derive a launch not seen before (raises what deriving raises)."""
        if holds_data is not None and not holds_data(args, kwargs):
            raise metadata.NotALaunch
        launch = derive(args, kwargs)
        kind = by_facts.found_or_kept(metadata.facts_key(launch),
                                      lambda: kind_of(label, launch))
        if key is not None:
            kinds.keep(key, kind)
        return kind

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
            kind = by_key.get(key)  # (None is never a key)
            if kind is None:
                kind = learn(args, kwargs, key)
        except metadata.NotALaunch:  # meta or fake tensors: tracing, nothing runs
            kind = None
        except Exception as exc:
            kind, why = None, exc
        # The call runs outside the except blocks: its own exception carries none of ours.
        if kind is None:
            if why is None:
                return call_as_one_launch(state, wrapped, args, kwargs)
            return _run_unannotated(state, label, why, wrapped, args, kwargs)
        in_capture = False
        rings = None
        site = None
        if state.before_launch:  # a block, capture or journal open (one test for the three)
            if state.blocks and calls.blocks:  # in a _coalescing_manager block: the launch
                calls.blocks[-1].launches.append(kind.facts)
                return call_as_one_launch(state, wrapped, args, kwargs)
            marks = state.captures and agent.captures.torch_marks is not None
            if state.journals:  # (the record file's line is written before the call)
                rings = state.rings  # (rings alone: entered inline, below)
                if rings is None or marks:
                    return sink.run(LaunchEvent(kind, call_site(2), python_api),
                                    call_as_one_launch, state, wrapped, args, kwargs)
                # the caller's line where it is the user's (mostly: ``sites.SITES``), else found
                frame = _getframe(1)
                code = frame.f_code
                known_sites = call_sites.get(id(code))
                lines = known_sites[1] if known_sites and known_sites[0] is code else None
                site = lines.get(frame.f_lasti) if lines else None
                if site is None:
                    site = site_from(frame)
                try:
                    for ring in rings:
                        ring.enter_kind(kind, site)
                except Exception as exc:
                    warn_once(label, "writing the launch to the ring", exc)
                    rings = None
            elif marks:
                return sink.run(LaunchEvent(kind, call_site(2), python_api),
                                call_as_one_launch, state, wrapped, args, kwargs)
            in_capture = state.captures > 0  # the capture's ledger, noted below
        # call_as_one_launch, inlined (see there): this is the path that annotates
        inside[ident] = 1
        exclusion = state.exclusion if excludes else None
        try:
            if exclusion is None:
                try:
                    result = wrapped(*args, **kwargs)
                finally:
                    del inside[ident]
            else:
                # (an Exclusion's callables are read as attributes, then called: called as its
                # methods they would be looked up as methods, ~80 instructions more)
                claimed = exclusion.call
                if claimed is not None:  # the native observer's one call
                    try:
                        result = claimed(wrapped, args, kwargs)
                    finally:
                        del inside[ident]
                else:
                    set_excluded, dispatch_key = exclusion.set_excluded, exclusion.key
                    set_excluded(dispatch_key, True)
                    try:
                        result = wrapped(*args, **kwargs)
                    finally:
                        set_excluded(dispatch_key, False)
                        del inside[ident]
        except BaseException:
            if rings is not None:  # (the ring's record of it: failed)
                _rings_returned(rings, True)
            raise
        if rings is not None:  # (``_rings_returned``, inlined)
            try:
                for ring in rings:
                    ring.returned(False, result)
            except Exception as exc:
                warn_once("ring", "writing the launch's end to the ring", exc)
        # after the call: a launch that raised is in no ledger and no record
        if in_capture:  # into its graph's ledger (a failure is said once; the launch stands)
            if site is None:  # (the ring's, where one is open)
                site = site_from(_getframe(1))
            try:
                note_in_ledger(label, kind.annotation, kind.kernels, site)
            except Exception as exc:
                warn_once(label, "noting the launch in its graph's ledger", exc)
        recorders = state.recorders
        if recorders:
            if site is None:  # our caller's line, where it is the user's (mostly), else found
                # (inline: a helper's call costs ~400 instructions a recorded launch)
                frame = _getframe(1)
                code = frame.f_code
                known_sites = call_sites.get(id(code))  # (see sites.SITES)
                lines = known_sites[1] if known_sites and known_sites[0] is code else None
                site = lines.get(frame.f_lasti) if lines else None
                if site is None:
                    site = call_site(2)
            # (by position: on a tuple subclass the cheapest read; 1, 2: its annotation and
            # CPU-only keys, as Kind names them)
            entry = new_tuple(Record, (label, kind[1], site, kind[2]))
            for recording in recorders:
                if python_api or not recording.python_api_only:
                    recording.append(entry)
        return result

    def kind_for(args: tuple, kwargs: dict) -> Kind:
        """The launch's Kind, by its key (derived the first time; raises what deriving
        raises). The wrapper above does the same inline: its hot path."""
        key = plan.key_of(args, kwargs)
        kind = by_key.get(key)  # (None is never a key)
        return kind if kind is not None else learn(args, kwargs, key)

    def note_in_capture(args: tuple, kwargs: dict, site: str) -> None:
        """A launch handed to the native observer that it did not note (its process group
        made no record of it): into the capture's ledger as the wrapper above notes it, after
        the call."""
        try:
            kind = kind_for(args, kwargs)
        except metadata.NotALaunch:  # meta or fake tensors: tracing, nothing runs
            return
        except Exception as exc:
            warn_once(label, "deriving the collective metadata", exc)
            return
        try:
            note_in_ledger(label, kind.annotation, kind.kernels, site)
        except Exception as exc:
            warn_once(label, "noting the launch in its graph's ledger", exc)

    def noted_as(args: tuple, kwargs: dict) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        """What a launch is noted as in its graph's ledger, ``(annotation, kernels)``, for the
        native observer's C wrapper, which keys calls as ``plan.key_of`` does and asks once
        per key; None where nothing is derived (the wrapper then runs, and says why)."""
        try:
            kind = kind_for(args, kwargs)
        except Exception:
            return None
        return kind.annotation, kind.kernels

    def ring_ids(args: tuple, kwargs: dict) -> tuple[int, int] | None:
        """(The native C wrapper, once a key, after this wrapper wrote the launch to the one
        ring open) the ids its launch was written with in that ring, attached to the native
        writer now if it can be: its kind's and its group's slot; None where the ring is not
        the writer's (this wrapper then writes launches of that key)."""
        rings = state.rings
        native_ring = agent.native_ring
        if rings is None or len(rings) != 1 or native_ring is None:
            return None
        try:
            kind = kind_for(args, kwargs)
        except Exception:
            return None
        return native_ring.ids(rings[0], kind)

    def through_sink(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict
                     ) -> Any:
        """The same launches, every one the wrapper above annotates handed to the sink to run
        (``INLINE`` false); the others (no demand, inside a wrapped call or a block, not
        derived) as the wrapper above runs them."""
        __tracebackhide__ = True
        kind = None
        if state.demand and get_ident() not in inside and not (state.blocks and calls.blocks):
            try:
                kind = kind_for(args, kwargs)
            except Exception:  # (the wrapper above derives it again, and says why)
                kind = None
        if kind is None:
            return wrapper(wrapped, instance, args, kwargs)
        return sink.run(LaunchEvent(kind, call_site(2), python_api), call_as_one_launch,
                        state, wrapped, args, kwargs)

    chosen = wrapper if INLINE else through_sink
    chosen.note_in_capture = note_in_capture  # type: ignore[attr-defined]
    chosen.noted_as = noted_as  # type: ignore[attr-defined]
    chosen.ring_ids = ring_ids  # type: ignore[attr-defined]
    return chosen


class CoalescingBlock:
    """Stands in for ``_coalescing_manager(...)``: the calls inside are one launch."""

    def __init__(self, manager: Any, label: str, agent: Any) -> None:
        self._manager = manager
        self._label = label
        self._agent = agent
        self.launches: list[metadata.LaunchFacts] = []

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
            event: LaunchEvent | None = self._event()
        except Exception as own:
            warn_once(self._label, "deriving the collective metadata", own)
            event = None
        if event is None:  # outside the except block: the block's exception carries none of ours
            return self._manager.__exit__(None, None, None)
        return self._agent.sink.run(event, call_as_one_launch, state, self._manager.__exit__,
                                    (None, None, None), {})

    def _event(self) -> LaunchEvent:
        """The block's launch: one kind of launch, summed, where they are alike."""
        launch = metadata.coalesced(self.launches)
        kernels = tuple(sorted({k for launch in self.launches for k in launch.kernels}))
        if launch is not None:
            kind = kind_of(self._label, launch)
            kind = kind._replace(kernels=kernels)
        else:  # point-to-point or mixed: eager gives this kernel no collective args
            lane = self.launches[0].group.lane
            kind = Kind(self._label, {V.NAME: self._label, V.STREAM: lane}, {}, kernels, None)
        return LaunchEvent(kind)


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

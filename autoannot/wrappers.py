"""The wrapper functions the wrapt proxies call: one per row role, built from the table.

Hot path: with no recorder open and no capture in progress (``STATE.demand`` false) a wrapper
calls the original at once. Otherwise it derives the launch metadata, enters the annotation
context around the original, and never lets a failure of its own reach the caller.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from autoannot import metadata, patching
from autoannot import vocabulary as V
from autoannot.annotation import AnnotationContext
from autoannot.collectives import C10D, Collective, Role
from autoannot.diagnostics import warn_once
from autoannot.patching import INSTRUMENTATION
from autoannot.recorder import call_site, enter, new_record, publish
from autoannot.state import CALLS, STATE

Wrapper = Callable[[Callable[..., Any], Any, tuple, dict], Any]

# The frames of this module are marked ``__tracebackhide__`` (pytest, IPython and others leave
# them out of the tracebacks they show): an exception raised by a collective the agent
# annotated reads as it does with the agent off.


def call_as_one_launch(wrapped: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Run a call whose launch is annotated here: wrapped calls inside it (``CALLS.depth``)
    and the dispatcher kernels below it take it for the same launch (the dispatcher layer's
    key is excluded around it: the launch does not also pass through a Python kernel below,
    the same launch, ~20 us for nothing)."""
    __tracebackhide__ = True
    layer = INSTRUMENTATION.dispatcher
    exclusion = layer.exclusion if layer is not None else None
    CALLS.depth += 1
    if exclusion is None:
        try:
            return wrapped(*args, **kwargs)
        finally:
            CALLS.depth -= 1
    set_excluded, key = exclusion
    set_excluded(key, True)
    try:
        return wrapped(*args, **kwargs)
    finally:
        set_excluded(key, False)
        CALLS.depth -= 1


def _run_annotated(
    label: str, ctx: AnnotationContext, wrapped: Callable[..., Any], args: tuple, kwargs: dict
) -> Any:
    __tracebackhide__ = True
    try:
        ctx.__enter__()
        entered = True
    except Exception as exc:
        warn_once(label, "entering the annotation context", exc)
        entered = False
    if not entered:  # outside the except block: the caller's exception carries none of ours
        return wrapped(*args, **kwargs)
    try:
        result = call_as_one_launch(wrapped, args, kwargs)
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
    label: str, why: BaseException, wrapped: Callable[..., Any], args: tuple, kwargs: dict
) -> Any:
    """The metadata could not be derived: run the call (the same launch: not annotated again
    by a dispatcher kernel below); if it succeeds, say so once."""
    __tracebackhide__ = True
    result = call_as_one_launch(wrapped, args, kwargs)
    warn_once(label, "deriving the collective metadata", why)
    return result


#: Annotations kept per wrapped function for launches seen before (same group, sizes, dtype):
#: training repeats the same few launches, each step.
CACHE_SIZE = 4096


def launch_wrapper(row: Collective, plan: metadata.Plan) -> Wrapper:
    """The wrapper of a function that launches one collective."""
    label = row.label
    derive = plan.derive
    seen: dict[tuple, tuple[dict[str, Any], dict[str, Any]]] = {}

    def annotate(launch: metadata.Launch) -> tuple[dict[str, Any], dict[str, Any]]:
        """The annotation and CPU-only keys of a launch: built once per distinct launch, then
        shared by the records of the same launch (read-only: never mutate a record's dicts)."""
        key = launch[1:9]  # group facts (by identity), sizes, dtype, splits, ranks
        found = seen.get(key)
        if found is None:
            if len(seen) >= CACHE_SIZE:
                seen.clear()
            found = seen[key] = (metadata.annotation_of(label, launch),
                                 metadata.cpu_only_args(launch))
        return found

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        __tracebackhide__ = True
        state = STATE
        if not state.demand:
            return wrapped(*args, **kwargs)
        calls = CALLS
        if calls.depth:  # launched from inside another wrapped call
            return wrapped(*args, **kwargs)
        why: Exception | None = None
        try:
            launch = derive(args, kwargs)
        except metadata.NotALaunch:  # meta or fake tensors: tracing, nothing runs
            launch = None
        except Exception as exc:
            launch, why = None, exc
        # The call runs outside the except blocks: its own exception carries none of ours.
        if launch is None:
            if why is None:
                return call_as_one_launch(wrapped, args, kwargs)
            return _run_unannotated(label, why, wrapped, args, kwargs)
        if calls.blocks:  # inside a _coalescing_manager block: the block is the launch
            calls.blocks[-1].launches.append(launch)
            return call_as_one_launch(wrapped, args, kwargs)
        annotation, cpu_only = annotate(launch)
        if state.captures:  # a capture needs the context (mark_kernels, the graph's ledger)
            ctx = AnnotationContext(label, annotation, cpu_only, launch.kernels)
            return _run_annotated(label, ctx, wrapped, args, kwargs)
        site = None
        if state.journals:  # written before the call: a collective that hangs is in the file
            site = call_site(2)  # from our caller
            enter(new_record(label, annotation, site, cpu_only))
        result = call_as_one_launch(wrapped, args, kwargs)  # recorders: run, then publish
        if state.recorders:
            try:
                publish(new_record(label, annotation, site or call_site(2), cpu_only))
            except Exception as exc:
                warn_once(label, "recording", exc)
        return result

    return wrapper


class CoalescingBlock:
    """Stands in for ``_coalescing_manager(...)``: the calls inside are one launch."""

    def __init__(self, manager: Any, label: str) -> None:
        self._manager = manager
        self._label = label
        self.launches: list[metadata.Launch] = []

    def __enter__(self) -> Any:
        value = self._manager.__enter__()
        CALLS.blocks.append(self)
        return value

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        __tracebackhide__ = True
        CALLS.blocks.remove(self)
        if exc_type is not None or not self.launches:
            return self._manager.__exit__(exc_type, exc, tb)
        try:
            ctx: AnnotationContext | None = self._context()
        except Exception as own:
            warn_once(self._label, "deriving the collective metadata", own)
            ctx = None
        if ctx is None:  # outside the except block: the block's exception carries none of ours
            return self._manager.__exit__(None, None, None)
        return _run_annotated(self._label, ctx, self._manager.__exit__, (None, None, None), {})

    def _context(self) -> AnnotationContext:
        launch = metadata.coalesced(self.launches)
        if launch is not None:
            annotation = metadata.annotation_of(self._label, launch)
            cpu_only = metadata.cpu_only_args(launch)
        else:  # point-to-point or mixed: eager gives this kernel no collective args
            lane = self.launches[0].facts.lane
            annotation, cpu_only = {V.NAME: self._label, V.STREAM: lane}, {}
        kernels = tuple(sorted({k for launch in self.launches for k in launch.kernels}))
        return AnnotationContext(self._label, annotation, cpu_only, kernels)


def block_wrapper(row: Collective, plan: metadata.Plan) -> Wrapper:
    """The wrapper of ``_coalescing_manager``."""

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        __tracebackhide__ = True
        manager = wrapped(*args, **kwargs)
        if not STATE.demand or CALLS.depth:
            return manager
        label = CALLS.batch_label or row.api
        return CoalescingBlock(manager, label)

    return wrapper


def _current_p2p_functions() -> dict[Any, Any]:
    """Map isend/irecv, original or proxy, to the object c10d's module holds now."""
    c10d = sys.modules[C10D]
    mapping: dict[Any, Any] = {}
    for name in ("isend", "irecv"):
        current = getattr(c10d, name)
        original = getattr(current, "__wrapped__", current)
        mapping[id(original)] = current
        for proxy in patching.proxies_of(original):
            mapping[id(proxy)] = current
    return mapping


def normalize_p2p_ops(ops: Any) -> Any:
    """P2POps built before ``enable()`` (or after ``disable()``) name another isend/irecv object
    than c10d's module does now; torch tests ``op.op is isend``. Hand it copies that match."""
    if not isinstance(ops, list | tuple):
        return ops
    mapping = _current_p2p_functions()
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


def batch_wrapper(row: Collective, plan: metadata.Plan) -> Wrapper:
    """The wrapper of ``batch_isend_irecv``: labels the launches made inside it."""

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        __tracebackhide__ = True
        try:
            if args:
                args = (normalize_p2p_ops(args[0]), *args[1:])
            elif "p2p_op_list" in kwargs:
                kwargs = {**kwargs, "p2p_op_list": normalize_p2p_ops(kwargs["p2p_op_list"])}
        except Exception as exc:
            warn_once(row.label, "matching P2POp functions", exc)
        if not STATE.demand:
            return wrapped(*args, **kwargs)
        previous, CALLS.batch_label = CALLS.batch_label, row.label
        try:
            return wrapped(*args, **kwargs)
        finally:
            CALLS.batch_label = previous

    return wrapper


WRAPPER_FACTORIES: dict[Role, Callable[[Collective, metadata.Plan], Wrapper]] = {
    Role.LAUNCH: launch_wrapper,
    Role.BLOCK: block_wrapper,
    Role.BATCH: batch_wrapper,
}

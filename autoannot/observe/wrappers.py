"""The wrapper functions the wrapt proxies call: one per row role, built from the table.

A launch's wrapper is the route's launch function for its row (``keep.route.launcher``: with
nothing open it calls the original at once; else it runs the call as one launch and writes it
where the route's rule says), given the row's kinds (``RowKinds``: each derived once). The
coalescing block and the batch's label are this module's; a failure of its own never reaches
the caller.
"""

from __future__ import annotations

import sys
from _thread import get_ident
from collections.abc import Callable
from typing import Any

from autoannot.base.diagnostics import warn_once
from autoannot.describe import metadata
from autoannot.describe import vocabulary as V
from autoannot.describe.collectives import C10D, OPS, Collective, Role
from autoannot.describe.kinds import Kind, Kinds, kind_of
from autoannot.keep.route import EXCLUDES, PYTHON_API, launcher, one_launch

_getframe = sys._getframe
Wrapper = Callable[[Callable[..., Any], Any, tuple, dict], Any]

# The frames of this module are marked ``__tracebackhide__`` (pytest, IPython and others leave
# them out of the tracebacks they show): an exception raised by a collective the agent
# annotated reads as it does with the agent off.


class Exclusion:
    """How a launch's call is run so that no observer below annotates it again: ``call(function,
    args, kwargs)`` does it (the native observer's), or else a dispatch key is excluded around it
    (``set_excluded(key, True)``, then ``False``: the Python layer's). ``keep.route`` runs it."""

    __slots__ = ("call", "key", "set_excluded")

    def __init__(self, set_excluded: Any = None, key: Any = None, call: Any = None) -> None:
        self.set_excluded = set_excluded
        self.key = key
        self.call = call


class RowKinds:
    """The kinds of launch of one row's wrapper: found by key (``Plan.key_of``: the group's id,
    tensor dtypes and sizes, read straight from the arguments), a new one derived in full, once,
    and its ``Kind`` shared by every key whose launch has the same facts; and what the native
    module's C wrapper of the row asks of them (``noted_as``, ``note_in_capture``,
    ``ring_ids``). ``holds_data``: the row's wrapper is a dispatcher kernel's redispatch, which
    goes below the agent's key: a launch not found by its key is annotated only if
    ``holds_data(args, kwargs)`` says its tensors hold data (the kernels' own test)."""

    def __init__(self, row: Collective, plan: metadata.Plan, agent: Any,
                 holds_data: Callable[[tuple, dict], bool] | None) -> None:
        self.label = row.label
        self.plan = plan
        self.agent = agent
        self.holds_data = holds_data
        self.kinds = Kinds()  # launch key -> its Kind
        self.by_key = self.kinds.by_key  # (its dict: read on the hot path)
        self.by_facts = Kinds()  # a launch's facts -> its Kind (one Kind for keys alike in them)

    def learn(self, args: tuple, kwargs: dict, key: tuple | None) -> Kind:
        """Derive a launch not seen before (raises what deriving raises)."""
        if self.holds_data is not None and not self.holds_data(args, kwargs):
            raise metadata.NotALaunch
        launch = self.plan.derive(args, kwargs)
        kind = self.by_facts.found_or_kept(metadata.facts_key(launch),
                                           lambda: kind_of(self.label, launch))
        if key is not None:
            self.kinds.keep(key, kind)
        return kind

    def kind_for(self, args: tuple, kwargs: dict) -> Kind:
        """The launch's Kind, by its key (derived the first time; raises what deriving
        raises). The wrapper does the same inline: its hot path."""
        key = self.plan.key_of(args, kwargs)
        kind = self.kinds.by_key.get(key)  # (None is never a key)
        return kind if kind is not None else self.learn(args, kwargs, key)

    def note_in_capture(self, args: tuple, kwargs: dict, site: str) -> None:
        """A launch handed to the native observer that it did not note (its process group made
        no record of it): into the capture's ledger, through the route."""
        try:
            kind = self.kind_for(args, kwargs)
        except metadata.NotALaunch:  # meta or fake tensors: tracing, nothing runs
            return
        except Exception as exc:
            warn_once(self.label, "deriving the collective metadata", exc)
            return
        self.agent.state.route.in_ledger(kind, site)

    def noted_as(self, args: tuple, kwargs: dict) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        """What a launch is noted as in its graph's ledger, ``(annotation, kernels)``, for the
        native observer's C wrapper, which keys calls as ``plan.key_of`` does and asks once
        per key; None where nothing is derived (the wrapper then runs, and says why)."""
        try:
            kind = self.kind_for(args, kwargs)
        except Exception:
            return None
        return kind.annotation, kind.kernels

    def ring_ids(self, args: tuple, kwargs: dict) -> tuple[int, int] | None:
        """(The native C wrapper, once a key, after the row's wrapper wrote the launch to the one
        ring open) the ids its launch was written with in that ring, attached to the native
        writer now if it can be: its kind's and its group's slot; None where the ring is not
        the writer's (the Python wrapper then writes launches of that key)."""
        native_ring = self.agent.native_ring
        if native_ring is None:
            return None
        try:
            kind = self.kind_for(args, kwargs)
        except Exception:
            return None
        return self.agent.state.route.for_native(kind, None, native_ring.module)


def launch_wrapper(row: Collective, plan: metadata.Plan, agent: Any,
                   holds_data: Callable[[tuple, dict], bool] | None = None) -> Wrapper:
    """The wrapper of a function that launches one collective, reporting to ``agent`` (the
    ``Instrumentation``: its ``state``): the route's launch function for this row
    (``keep.route.launcher``), its kinds found or derived by ``RowKinds``, with what the native
    module's C wrapper asks of them. ``holds_data``: see ``RowKinds``."""
    kinds = RowKinds(row, plan, agent, holds_data)
    # Exclude our key around the call: a proxy's call, and a compiled op's redispatch (torch's
    # _c10d_functional kernels launch a c10d:: op, where a kernel of ours would be called again,
    # ~7 us to be let through); a c10d:: op's redispatch launches nothing of ours below. A
    # dispatcher kernel's launch is below the Python API.
    how = ((PYTHON_API if holds_data is None else 0)
           | (EXCLUDES if holds_data is None or row.module == OPS else 0))
    wrapper = launcher(kinds, how, agent.state)
    wrapper.note_in_capture = kinds.note_in_capture  # type: ignore[attr-defined]
    wrapper.noted_as = kinds.noted_as  # type: ignore[attr-defined]
    wrapper.ring_ids = kinds.ring_ids  # type: ignore[attr-defined]
    return wrapper


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
            kind: Kind | None = self._kind()
        except Exception as own:
            warn_once(self._label, "deriving the collective metadata", own)
            kind = None
        if kind is None:  # outside the except block: the block's exception carries none of ours
            return self._manager.__exit__(None, None, None)
        return state.route.run_whole(kind, None, True, one_launch, state, EXCLUDES,
                                     self._manager.__exit__, (None, None, None), {})

    def _kind(self) -> Kind:
        """The block's launch: one kind of launch, summed, where they are alike."""
        launch = metadata.coalesced(self.launches)
        kernels = tuple(sorted({k for launch in self.launches for k in launch.kernels}))
        if launch is not None:
            kind = kind_of(self._label, launch)
            kind = kind._replace(kernels=kernels)
        else:  # point-to-point or mixed: eager gives this kernel no collective args
            lane = self.launches[0].group.lane
            kind = Kind(self._label, {V.NAME: self._label, V.STREAM: lane}, {}, kernels, None)
        return kind


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

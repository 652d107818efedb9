"""Turn one call of a wrapped collective into the args the eager profiler would record for it."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autoannot import groups
from autoannot import vocabulary as V
from autoannot.collectives import Collective, Rank, Sizes, Splits

_MISSING = object()


class ArgReader:
    """Reads named parameters from ``(args, kwargs)`` by position or keyword, without binding."""

    __slots__ = ("_defaults", "_positions")

    def __init__(self, function: Callable[..., Any]) -> None:
        params = inspect.signature(function).parameters.values()
        self._positions = {p.name: i for i, p in enumerate(params)}
        self._defaults = {
            p.name: (None if p.default is inspect.Parameter.empty else p.default)
            for p in inspect.signature(function).parameters.values()
        }

    def get(self, args: tuple[Any, ...], kwargs: dict[str, Any], name: str | None) -> Any:
        if name is None:
            return None
        value = kwargs.get(name, _MISSING)
        if value is not _MISSING:
            return value
        position = self._positions.get(name)
        if position is not None and position < len(args):
            return args[position]
        return self._defaults.get(name)


@dataclass(frozen=True, slots=True)
class Launch:
    """The facts of one collective launch, before they become an annotation."""

    row: Collective
    eager_name: str | None  # "Collective name"
    facts: groups.GroupFacts
    in_nelems: int
    out_nelems: int
    dtype: str
    in_splits: str
    out_splits: str
    rank: int
    peer_global_rank: int | None = None


def _tensors(value: Any) -> Sequence[Any]:
    if value is None:
        return ()
    return value if isinstance(value, list | tuple) else (value,)


def _numel(tensors: Sequence[Any], complex_as_real: bool) -> int:
    total = 0
    for t in tensors:
        n = t.numel()
        total += 2 * n if complex_as_real and t.is_complex() else n
    return total


def _dtype(tensors: Sequence[Any], complex_as_real: bool) -> str:
    dtype = tensors[0].dtype
    if complex_as_real and dtype.is_complex:
        dtype = V.complex_as_real(dtype)
    return V.dtype_name(dtype)


def _group_rank(facts: groups.GroupFacts, global_rank: Any, group_rank: Any) -> int:
    if group_rank is not None:
        return int(group_rank)
    if global_rank is None:
        return -1
    return facts.ranks.index(int(global_rank))


def derive(row: Collective, reader: ArgReader, args: tuple, kwargs: dict) -> Launch:
    """Apply the row's rules to one call; raises if the arguments do not allow it."""
    group = reader.get(args, kwargs, row.group_param)
    pg = groups.resolve_any(group) if row.any_group else groups.resolve_c10d(group)
    facts = groups.facts_of(pg)
    real = row.complex_as_real
    inputs = _tensors(reader.get(args, kwargs, row.inputs))
    outputs = _tensors(reader.get(args, kwargs, row.outputs))
    n_in = _numel(inputs, real)
    n_out = _numel(outputs, real)
    size = facts.size
    sizes = row.sizes
    if sizes is Sizes.SAME:
        counts = (n_in, n_in)
    elif sizes is Sizes.GATHER:
        counts = (n_in, n_in * size)
    elif sizes is Sizes.SCATTER:
        counts = (n_out * size, n_out)
    elif sizes is Sizes.IN_OUT:
        counts = (n_in, n_out)
    elif sizes is Sizes.SHARD:
        counts = (n_in, n_in // size)
    elif sizes is Sizes.ALL_TO_ALL:
        counts = (n_in, n_in)
    elif sizes is Sizes.ZERO:
        counts = (0, 0)
    else:  # Sizes.SPLIT_ROWS
        counts = (n_in, n_in)  # refined below once the splits are known

    in_splits = out_splits = V.EMPTY_LIST
    if row.splits is Splits.GIVEN:
        given_in = reader.get(args, kwargs, row.split_params[0])
        given_out = reader.get(args, kwargs, row.split_params[1])
        in_splits = V.format_list(given_in or ())
        out_splits = V.format_list(given_out or ())
    elif row.splits is Splits.NUMELS:
        in_splits = V.format_list([_numel((t,), real) for t in inputs])
        out_splits = V.format_list([_numel((t,), real) for t in outputs])
    elif row.splits is Splits.EQUAL_IF_NONE:
        given_in = reader.get(args, kwargs, row.split_params[0])
        given_out = reader.get(args, kwargs, row.split_params[1])
        rows = inputs[0].shape[0]
        equal = [rows // size] * size
        given_in = equal if given_in is None else given_in
        given_out = equal if given_out is None else given_out
        in_splits, out_splits = V.format_list(given_in), V.format_list(given_out)
        row_numel = n_in // rows if rows else 0
        counts = (n_in, sum(int(s) for s in given_out) * row_numel)

    if row.dtype_from == "byte":
        dtype = "Byte"
    else:
        dtype = _dtype(inputs if row.dtype_from == "input" else outputs, real)

    rank, peer = facts.rank, None
    if row.rank is not Rank.SELF:
        named = [reader.get(args, kwargs, p) for p in row.root_params]
        if row.root_is_group_rank:
            rank = int(named[0])
        else:
            rank = _group_rank(facts, named[0], named[1] if len(named) > 1 else None)
        if row.rank is Rank.PEER and 0 <= rank < len(facts.ranks):
            peer = facts.ranks[rank]
    return Launch(
        row, row.eager_name, facts, counts[0], counts[1], dtype, in_splits, out_splits, rank, peer
    )


def kernel_args(launch: Launch) -> dict[str, Any]:
    """The args the profiler puts on the eager NCCL kernel of this launch, in its key order."""
    facts = launch.facts
    name = launch.eager_name
    args: dict[str, Any] = {
        V.COLLECTIVE_NAME: name,
        V.IN_NELEMS: launch.in_nelems,
        V.OUT_NELEMS: launch.out_nelems,
        V.GROUP_SIZE: facts.size,
        V.DTYPE: launch.dtype,
        V.IN_SPLIT: launch.in_splits,
        V.OUT_SPLIT: launch.out_splits,
    }
    args.update(facts.group_keys())
    if launch.peer_global_rank is not None:
        args[V.DST_RANK if name == "send" else V.SRC_RANK] = launch.peer_global_rank
    return args


def cpu_only_args(launch: Launch) -> dict[str, Any]:
    """The keys the CPU ``record_param_comms`` op adds to the kernel's."""
    facts = launch.facts
    args: dict[str, Any] = {V.RANK: launch.rank}
    if facts.global_rank_start >= 0:
        args[V.GLOBAL_RANK_START] = facts.global_rank_start
    if facts.global_rank_stride > 0:
        args[V.GLOBAL_RANK_STRIDE] = facts.global_rank_stride
    return args


def annotation_of(api: str, launch: Launch) -> dict[str, Any]:
    """The annotation the agent attaches: the eager kernel args plus the lane's name and stream."""
    args = kernel_args(launch)
    args[V.NAME] = api
    args[V.STREAM] = launch.facts.lane
    return args


def coalesced(launches: Sequence[Launch]) -> Launch | None:
    """One launch for a ``_coalescing_manager`` block of same-kind collectives (sizes summed);
    None when the block holds point-to-point or mixed calls, whose kernel carries no args."""
    first = launches[0]
    name = first.row.coalesced_name
    if name is None or any(launch.row.coalesced_name != name for launch in launches):
        return None
    return Launch(
        row=first.row,
        eager_name=name,
        facts=first.facts,
        in_nelems=sum(launch.in_nelems for launch in launches),
        out_nelems=sum(launch.out_nelems for launch in launches),
        dtype=first.dtype,
        in_splits=V.EMPTY_LIST,
        out_splits=V.EMPTY_LIST,
        rank=first.rank,
    )

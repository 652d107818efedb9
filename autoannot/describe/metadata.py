"""Turn one call of a wrapped collective into the args the eager profiler would record for it.

Each table row is compiled once, against the installed function's signature, into a ``Plan``:
a handful of closures picked by the row's rules, so a call pays for argument lookups and a
few multiplications, not for interpreting the table.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from autoannot.describe import groups
from autoannot.describe import vocabulary as V
from autoannot.describe.collectives import Collective, GroupArg, Rank, Sizes, Splits

Getter = Callable[[tuple, dict], Any]


class NotALaunch(Exception):
    """The call's tensors hold no data (meta, fake or functional tensors: tracing): nothing is
    launched, so nothing is annotated and nothing is said."""


#: Tensor types that hold no data (the dispatcher kernels check the same).
NO_DATA_TYPES = frozenset({"FakeTensor", "FunctionalTensor"})


class LaunchFacts(NamedTuple):
    """What the table's rule derives from one launch's arguments, before it becomes an
    annotation (``describe.kinds``)."""

    eager_name: str | None  # "Collective name"
    group: groups.GroupFacts
    in_nelems: int
    out_nelems: int
    dtype: str
    in_splits: str
    out_splits: str
    rank: int | None  # the CPU op's "Rank": own, root's or peer's group rank (None: unknown)
    peer_global_rank: int | None  # "Dst Rank" / "Src Rank"
    coalesced_name: str | None  # "Collective name" of a _coalescing_manager block of these
    kernels: tuple[str, ...]  # the NCCL kernel families this launch may run


def _positions(function: Any) -> dict[str, tuple[int, Any]]:
    """Each parameter's position and default, from a Python signature or an op's schema
    (keyword-only arguments get no position a call can reach)."""
    if function is None:
        return {}
    schema = getattr(function, "_schema", None)
    if schema is not None:  # an OpOverload: torch's dispatcher passes kwarg-only args by name
        return {arg.name: (len(schema.arguments) if arg.kwarg_only else position,
                           arg.default_value if arg.has_default_value() else None)
                for position, arg in enumerate(schema.arguments)}
    found = {}
    for position, param in enumerate(inspect.signature(function).parameters.values()):
        default = None if param.default is inspect.Parameter.empty else param.default
        found[param.name] = (position, default)
    return found


def _getter(positions: dict[str, tuple[int, Any]], name: str | None) -> Getter:
    """Read one parameter by keyword or position (``Signature.bind`` costs microseconds)."""
    if name is None:
        return lambda args, kwargs: None
    if name not in positions:
        return lambda args, kwargs: kwargs.get(name)
    position, default = positions[name]

    def get(args: tuple, kwargs: dict) -> Any:
        if kwargs and name in kwargs:
            return kwargs[name]
        return args[position] if position < len(args) else default

    return get


def _as_list(value: Any) -> Sequence[Any]:
    """The tensors a parameter holds: one, a list, or a list of lists (the c10d ops')."""
    if value is None:
        return ()
    if type(value) not in (list, tuple):
        return (value,)
    if value and type(value[0]) in (list, tuple):
        return [t for inner in value for t in inner]
    return value


def _numel(tensors: Sequence[Any], as_real: bool) -> int:
    if len(tensors) == 1 and not as_real:
        return tensors[0].numel()
    total = 0
    for t in tensors:
        total += 2 * t.numel() if as_real and t.is_complex() else t.numel()
    return total


def _dtype(tensors: Sequence[Any], as_real: bool) -> str:
    dtype = tensors[0].dtype
    if as_real and dtype.is_complex:
        dtype = V.complex_as_real(dtype)
    return V.dtype_name(dtype)


#: (in nelems, out nelems) from (numel of inputs, numel of outputs, group size).
_COUNTS: dict[Sizes, Callable[[int, int, int], tuple[int, int]]] = {
    Sizes.SAME: lambda n_in, n_out, size: (n_in, n_in),
    Sizes.GATHER: lambda n_in, n_out, size: (n_in, n_in * size),
    Sizes.SCATTER: lambda n_in, n_out, size: (n_out * size, n_out),
    Sizes.IN_OUT: lambda n_in, n_out, size: (n_in, n_out),
    Sizes.SHARD: lambda n_in, n_out, size: (n_in, n_in // size),
    Sizes.ALL_TO_ALL: lambda n_in, n_out, size: (n_in, n_in),
    Sizes.SPLIT_ROWS: lambda n_in, n_out, size: (n_in, n_in),  # refined with the splits
    Sizes.ZERO: lambda n_in, n_out, size: (0, 0),
}


_RESOLVERS: dict[GroupArg, Callable[[Any], Any]] = {
    GroupArg.C10D: groups.resolve_c10d,
    GroupArg.ANY: groups.resolve_any,
    GroupArg.BOXED: groups.resolve_boxed,
}


class Plan:
    """A row compiled against the signature of the function it wraps: ``derive`` (a call's
    LaunchFacts) and ``key_of`` (the call's facts that decide its LaunchFacts, as a hashable key, or
    None where they are not few and plain enough to key on)."""

    __slots__ = ("_positions", "derive", "key_of", "row")

    def __init__(self, row: Collective, function: Callable[..., Any] | None) -> None:
        self.row = row
        self._positions = _positions(function)
        self.derive: Callable[[tuple, dict], LaunchFacts] = _compile(row, self._positions)
        #: Generated at the first call (a plan is made while torch is still importing).
        self.key_of: Callable[[tuple, dict], tuple | None] = self._first_key_of

    def _first_key_of(self, args: tuple, kwargs: dict) -> tuple | None:
        self.key_of = _compile_key(self.row, self._positions)
        return self.key_of(args, kwargs)

    def key_fields(self) -> list[KeyField] | None:
        """The facts ``key_of`` reads (see ``key_fields``)."""
        return key_fields(self.row, self._positions)


class KeyField(NamedTuple):
    """One fact of a launch key, read from one argument: ``what`` is ``"group"`` (its id,
    ``None`` the default group), ``"tensor"`` (its dtype and/or element count; a list of one
    tensor: that tensor; any other type: no key), ``"root"`` (an int or None, else no key) or
    ``"none"`` (given at all: no key). ``position``: where a call can pass it positionally
    (-1: by keyword only; -2: the row has no such parameter, it reads None)."""

    what: str
    name: str | None
    position: int
    default: Any
    dtype: bool = False
    numel: bool = False
    first: bool = False  # the tensor whose device says whether the call launches (meta: none)


def key_fields(row: Collective, positions: dict[str, tuple[int, Any]]
               ) -> list[KeyField] | None:
    """The facts ``key_of`` reads, in key order; None where the row is never keyed (its
    split sizes come from its tensors). The Python ``key_of`` is generated from them, and the
    native observer's C wrapper reads the same (see ``native/observer.cpp``)."""
    if row.splits in (Splits.NUMELS, Splits.EQUAL_IF_NONE):
        return None

    def field(what: str, name: str | None, **flags: Any) -> KeyField:
        if name is None:
            return KeyField(what, None, -2, None, **flags)
        if name not in positions:
            return KeyField(what, name, -1, None, **flags)
        position, default = positions[name]
        return KeyField(what, name, position, default, **flags)

    fields = [field("group", row.group_param)]
    if row.inputs is not None:
        fields.append(field("tensor", row.inputs, dtype=True, numel=True, first=True))
    if row.outputs is not None:
        counted = row.sizes in (Sizes.SCATTER, Sizes.IN_OUT) or row.inputs is None
        dtype = (row.dtype_from == "output" or row.inputs is None
                 or (counted and row.complex_as_real))  # a complex output counts twice
        fields.append(field("tensor", row.outputs, dtype=dtype, numel=counted,
                            first=row.inputs is None))
    fields += [field("root", name) for name in row.root_params]
    if row.splits is Splits.GIVEN:
        fields += [field("none", name) for name in row.split_params]
    return fields


def _compile_key(row: Collective, positions: dict[str, tuple[int, Any]]) -> Callable:
    """One function generated for the row: the call's launch key, read straight from its
    arguments — the group's ``id`` (resolved: ``None`` is the default group), each tensor's
    dtype and element count, the roots and split sizes where the row reads them. None (the
    call is derived in full) for anything else: lists of several tensors, tensors of other
    types or on the meta device, roots that are not ints, split sizes given.

    Every fact ``derive`` reads is in the key, so launches with one key have one LaunchFacts;
    ``groups.id_keyed`` caches forget their keys when a group they may name is gone."""
    import torch

    fields = key_fields(row, positions)
    if fields is None:
        return lambda args, kwargs: None
    namespace: dict[str, Any] = {"_Tensor": torch.Tensor, "_Parameter": torch.nn.Parameter,
                                 "_LISTS": (list, tuple),
                                 "_resolve": _RESOLVERS[row.group_arg], "_id": id, "_int": int}
    lines = ["def key_of(args, kwargs):", "    n = len(args)"]
    parts = []
    for i, field in enumerate(fields):
        local = f"v{i}"
        if field.position == -2:
            lines.append(f"    {local} = None")
        elif field.position == -1:
            lines.append(f"    {local} = kwargs.get({field.name!r})")
        else:
            namespace[f"_D_{local}"] = field.default
            lines.append(f"    {local} = kwargs[{field.name!r}] if {field.name!r} in kwargs "
                         f"else args[{field.position}] if n > {field.position} else _D_{local}")
        if field.what == "group":
            lines += _group_lines(row, local, namespace)
            parts.append(f"_id({local})")
        elif field.what == "tensor":
            lines += [f"    kind = type({local})",
                      "    if kind is not _Tensor:",
                      f"        if kind in _LISTS and len({local}) == 1:",
                      f"            {local} = {local}[0]",
                      f"            kind = type({local})",
                      "        if kind is not _Tensor and kind is not _Parameter:",
                      "            return None"]
            if field.first:
                lines += [f"    if {local}.is_meta:", "        return None"]
            if field.dtype:
                parts.append(f"{local}.dtype")
            if field.numel:
                parts.append(f"{local}.numel()")
        elif field.what == "root":
            lines += [f"    if {local} is not None and type({local}) is not _int:",
                      "        return None"]
            parts.append(local)
        else:  # "none"
            lines += [f"    if {local} is not None:", "        return None"]
    lines.append(f"    return ({', '.join(parts)},)")
    exec(compile("\n".join(lines), f"<autoannot key of {row.label}>", "exec"), namespace)
    return namespace["key_of"]


def _group_lines(row: Collective, local: str, namespace: dict[str, Any]) -> list[str]:
    """Resolve the group read into ``local`` (None: the default group, read from torch's
    state directly where it can be)."""
    if row.group_arg is not GroupArg.C10D:
        return [f"    {local} = _resolve({local})"]
    lines = [f"    if {local} is None:"]
    world = default_group_holder()
    if world is not None:
        namespace["_world"] = world
        lines += [f"        {local} = _world._default_pg",
                  f"        if {local} is None:",
                  f"            {local} = _resolve(None)"]
    else:
        lines.append(f"        {local} = _resolve(None)")
    return lines


def default_group_holder() -> Any:
    """torch's ``_world`` (its ``_default_pg`` is the default group), where c10d keeps one."""
    world = getattr(sys.modules.get("torch.distributed.distributed_c10d"), "_world", None)
    return world if world is not None and hasattr(world, "_default_pg") else None


def _compile(row: Collective, positions: dict[str, tuple[int, Any]]) -> Callable:
    get_group = _getter(positions, row.group_param)
    get_inputs = _getter(positions, row.inputs)
    get_outputs = _getter(positions, row.outputs)
    get_roots = [_getter(positions, p) for p in row.root_params]
    get_in_split = _getter(positions, row.split_params[0])
    get_out_split = _getter(positions, row.split_params[1])
    resolve = _RESOLVERS[row.group_arg]
    facts_of = groups.facts_of
    if not row.records_group_ranks:
        def facts_of(pg: Any, _of: Callable[[Any], groups.GroupFacts] = groups.facts_of
                     ) -> groups.GroupFacts:
            return groups.unranked(_of(pg))
    counts_of = _COUNTS[row.sizes]
    as_real = row.complex_as_real
    # The rules as plain booleans: enum comparisons cost more than the rest of a call.
    splits_given = row.splits is Splits.GIVEN
    splits_numels = row.splits is Splits.NUMELS
    splits_equal = row.splits is Splits.EQUAL_IF_NONE
    has_outputs = row.outputs is not None
    dtype_of_input, dtype_is_byte = row.dtype_from == "input", row.dtype_from == "byte"
    self_rank = row.rank is Rank.SELF
    peer_rank = row.rank is Rank.PEER
    root_is_group_rank = row.root_is_group_rank
    eager_name, coalesced_name = row.eager_name, row.coalesced_name
    kernels = tuple(sorted(row.kernels))
    empty = V.EMPTY_LIST
    fmt = V.format_list
    new_launch = tuple.__new__

    def derive(args: tuple, kwargs: dict) -> LaunchFacts:
        inputs = _as_list(get_inputs(args, kwargs))
        outputs = _as_list(get_outputs(args, kwargs)) if has_outputs else ()
        first = inputs[0] if inputs else outputs[0] if outputs else None
        if first is not None and (first.is_meta or type(first).__name__ in NO_DATA_TYPES):
            raise NotALaunch
        facts = facts_of(resolve(get_group(args, kwargs)))
        n_in = _numel(inputs, as_real)
        n_out = _numel(outputs, as_real) if has_outputs else 0
        size = facts.size
        n_in_msg, n_out_msg = counts_of(n_in, n_out, size)

        in_splits = out_splits = empty
        if splits_given:
            in_splits = fmt(get_in_split(args, kwargs) or ())
            out_splits = fmt(get_out_split(args, kwargs) or ())
        elif splits_numels:
            in_splits = fmt([_numel((t,), as_real) for t in inputs])
            out_splits = fmt([_numel((t,), as_real) for t in outputs])
        elif splits_equal:
            given_in, given_out = get_in_split(args, kwargs), get_out_split(args, kwargs)
            rows = inputs[0].shape[0]
            equal = [rows // size] * size
            given_in = equal if given_in is None else given_in
            given_out = equal if given_out is None else given_out
            in_splits, out_splits = fmt(given_in), fmt(given_out)
            n_out_msg = sum(int(s) for s in given_out) * (n_in // rows if rows else 0)

        dtype = "Byte" if dtype_is_byte else _dtype(inputs if dtype_of_input else outputs, as_real)

        rank, peer = facts.rank, None
        if not self_rank:
            named = [get(args, kwargs) for get in get_roots]
            if len(named) > 1 and named[1] is not None:  # given as a group rank
                rank = int(named[1])
            elif not named or named[0] is None:
                rank = None  # recv from any source: the peer is not known at launch
            elif root_is_group_rank:
                rank = int(named[0])
            elif facts.ranks is not None:
                rank = facts.ranks.index(int(named[0]))
            else:
                rank = None  # a global rank in a group whose global ranks are not known
            recorded = facts.recorded_ranks  # the peer as the process group records it
            if peer_rank and rank is not None and 0 <= rank < len(recorded):
                peer = recorded[rank]
        # tuple.__new__: NamedTuple's own constructor parses its arguments (~0.3 us more)
        return new_launch(LaunchFacts, (eager_name, facts, n_in_msg, n_out_msg, dtype, in_splits,
                                   out_splits, rank, peer, coalesced_name, kernels))

    return derive


def derive(row: Collective, function: Callable[..., Any] | None, args: tuple,
           kwargs: dict) -> LaunchFacts:
    """Apply the row's rules to one call (compiling the row each time: for one-off use)."""
    return Plan(row, function).derive(args, kwargs)


def kernel_args(launch: LaunchFacts) -> dict[str, Any]:
    """The args the profiler puts on the eager NCCL kernel of this launch, in its key order."""
    facts = launch.group
    args: dict[str, Any] = {
        V.COLLECTIVE_NAME: launch.eager_name,
        V.IN_NELEMS: launch.in_nelems,
        V.OUT_NELEMS: launch.out_nelems,
        V.GROUP_SIZE: facts.size,
        V.DTYPE: launch.dtype,
        V.IN_SPLIT: launch.in_splits,
        V.OUT_SPLIT: launch.out_splits,
    }
    args.update(facts.group_keys)
    if launch.peer_global_rank is not None:
        key = V.DST_RANK if launch.eager_name == "send" else V.SRC_RANK
        args[key] = launch.peer_global_rank
    return args


def facts_key(launch: LaunchFacts) -> tuple:
    """What makes two launches of one function one kind: all their facts but those the
    function fixes (its eager and coalesced names, its kernels)."""
    return (launch.group, launch.in_nelems, launch.out_nelems, launch.dtype, launch.in_splits,
            launch.out_splits, launch.rank, launch.peer_global_rank)


def cpu_only_args(launch: LaunchFacts) -> dict[str, Any]:
    """The keys the CPU ``record_param_comms`` op adds to the kernel's (those known)."""
    if launch.rank is None:
        return dict(launch.group.global_rank_keys)
    return {V.RANK: launch.rank, **launch.group.global_rank_keys}


def annotation_of(api: str, launch: LaunchFacts) -> dict[str, Any]:
    """The annotation the agent attaches: the eager kernel args, then the lane's ``name``
    and ``stream``."""
    args = kernel_args(launch)
    args[V.NAME] = api
    args[V.STREAM] = launch.group.lane
    return args


def coalesced(launches: Sequence[LaunchFacts]) -> LaunchFacts | None:
    """One launch for a ``_coalescing_manager`` block of same-kind collectives (sizes summed);
    None when the block holds point-to-point or mixed calls, whose kernel carries no args."""
    first = launches[0]
    name = first.coalesced_name
    if name is None or any(launch.coalesced_name != name for launch in launches):
        return None
    return first._replace(
        eager_name=name,
        in_nelems=sum(launch.in_nelems for launch in launches),
        out_nelems=sum(launch.out_nelems for launch in launches),
        in_splits=V.EMPTY_LIST,
        out_splits=V.EMPTY_LIST,
        peer_global_rank=None,
    )


def launch_of_record(record: dict[str, Any], row: Collective | None) -> LaunchFacts:
    """The launch a process group's own record of it describes (``ParamCommsDebugInfo``, as
    the native observer reads it: what the profiler writes on the eager kernel); ``row``: the
    table's row of its operator (its kernel families), where known."""
    facts = groups.facts_of_record(
        record["group_name"], record["group_desc"], record["group_ranks"],
        record["world_size"], record["global_rank_start"], record["global_rank_stride"])
    name, rank = record["collective"], record["rank"]
    recorded = facts.recorded_ranks
    peer = recorded[rank] if name in ("send", "recv") and 0 <= rank < len(recorded) else None
    return tuple.__new__(LaunchFacts, (
        name, facts, record["in_nelems"], record["out_nelems"], record["dtype"],
        V.format_list(record["in_splits"]), V.format_list(record["out_splits"]), rank, peer,
        row.coalesced_name if row is not None else None,
        tuple(sorted(row.kernels)) if row is not None else ()))

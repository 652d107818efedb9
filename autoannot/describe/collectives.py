"""The collectives autoannot wraps, described once, as data.

Each row says where a function lives, which of its parameters hold the tensors and the group,
and which rule of ``ProcessGroupNCCL`` turns them into the eager profiler record: the
"Collective name", how "In/Out msg nelems" are counted, which tensor gives the dtype, whose rank
is "Rank", and how split sizes are reported. ``metadata.py`` applies the rules.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

C10D = "torch.distributed.distributed_c10d"
FUNCOL = "torch.distributed._functional_collectives"
OPS = "torch.ops._c10d_functional"  # the ops compiled code calls (annotated in dispatch.py)
#: The ops every ProcessGroup call dispatches through, from Python or C++ (DDP's reducer,
#: autograd, extensions): annotated in dispatch.py, for launches no proxy saw.
PG_OPS = "torch.ops.c10d"
#: Rows annotated by a kernel on torch's dispatcher rather than by a Python proxy.
OP_MODULES = (OPS, PG_OPS)
#: The symmetric-memory collectives (async tensor parallelism, custom all-reduces): no process
#: group call, so no hook sees them; a proxy of each op (packet and overloads) does.
SYMM_MEM = "torch.ops.symm_mem"
#: Rows whose proxies a Python module holds (and any module that imported them).
FUNCTION_MODULES = (C10D, FUNCOL)


class Role(enum.Enum):
    LAUNCH = "launch"  # one call, one kernel launch, one annotation
    BATCH = "batch"  # batch_isend_irecv: labels the launches made inside it
    BLOCK = "block"  # _coalescing_manager: the calls inside are one launch


class Sizes(enum.Enum):
    """How "In msg nelems" / "Out msg nelems" are counted."""

    SAME = "same"  # in = out = numel(input)
    GATHER = "gather"  # in = numel(input), out = in * group size
    SCATTER = "scatter"  # in = numel(output) * group size, out = numel(output)
    IN_OUT = "in_out"  # in = numel(input), out = numel(output)
    SHARD = "shard"  # in = numel(input), out = in / group size
    ALL_TO_ALL = "all_to_all"  # in = out = numel(inputs)
    SPLIT_ROWS = "split_rows"  # in = numel(input), out = sum(out splits) rows
    ZERO = "zero"  # barrier: 0 elements


class Rank(enum.Enum):
    """Whose group rank the CPU op records as "Rank"."""

    SELF = "self"
    ROOT = "root"  # broadcast/reduce/gather/scatter: the root
    PEER = "peer"  # send/recv: the peer, plus "Dst Rank"/"Src Rank" (its global rank)


class GroupArg(enum.Enum):
    """What the group parameter holds."""

    C10D = "c10d"  # a ProcessGroup; None: the default group
    ANY = "any"  # a ProcessGroup, ranks, a DeviceMesh, (mesh, dim) or a group name
    BOXED = "boxed"  # the dispatcher's boxed ProcessGroup (a ScriptObject)


class Splits(enum.Enum):
    """How "In split size" / "Out split size" are reported."""

    NONE = "none"  # "[]"
    GIVEN = "given"  # the split lists the caller passed ("[]" when None)
    NUMELS = "numels"  # all_to_all: each tensor's numel
    EQUAL_IF_NONE = "equal_if_none"  # funcol all_to_all_single: equal rows when None


#: NCCL kernel families (ncclDevKernel_<Family>_...), for matching graphed kernels to calls.
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = "AllReduce", "AllGather", "ReduceScatter"
BROADCAST, REDUCE, SEND_RECV = "Broadcast", "Reduce", "SendRecv"
#: The symmetric-memory kernels (``<family>_kernel<...>`` in CUDASymmetricMemoryOps.cu).
ONE_SHOT, TWO_SHOT = "one_shot_all_reduce", "two_shot_all_reduce"
MULTIMEM_ALL_REDUCE, MULTIMEM_REDUCE = "multimem_all_reduce", "multimem_one_shot_reduce"
MULTIMEM_ALL_GATHER = "multimem_all_gather"
SYMM_MEM_FAMILIES = (ONE_SHOT, TWO_SHOT, MULTIMEM_ALL_REDUCE, MULTIMEM_REDUCE,
                     MULTIMEM_ALL_GATHER)


@dataclass(frozen=True)
class Collective:
    """One wrapped function and the rules of its eager record."""

    api: str
    module: str
    eager_name: str | None  # "Collective name"; None: the kernel carries no collective args
    role: Role = Role.LAUNCH
    inputs: str | None = None  # parameter holding the input tensor (or list)
    outputs: str | None = None  # parameter holding the output tensor (or list)
    sizes: Sizes = Sizes.SAME
    dtype_from: str = "input"  # "input", "output" or "byte"
    rank: Rank = Rank.SELF
    root_params: tuple[str, ...] = ()  # (global-rank param, group-rank param) for ROOT/PEER
    root_is_group_rank: bool = False  # funcol broadcast: src is a group rank
    splits: Splits = Splits.NONE
    split_params: tuple[str, str] = ("input_split_sizes", "output_split_sizes")
    group_param: str = "group"
    group_arg: GroupArg = GroupArg.C10D
    complex_as_real: bool = False  # c10d sends complex tensors as view_as_real
    #: Whether the record holds the group's global ranks ("Process Group Ranks", "Global rank
    #: start/stride"); the symm_mem ops record start and stride -1: none.
    records_group_ranks: bool = True
    kernels: frozenset[str] = field(default_factory=frozenset)
    coalesced_name: str | None = None  # "Collective name" of a _coalescing_manager block

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.api}"

    @property
    def label(self) -> str:
        """The annotation's "name": ``all_reduce``, ``funcol.all_reduce``,
        ``_c10d_functional.all_reduce_``, ``c10d.allreduce_``."""
        return _LABEL_PREFIX[self.module] + self.api


_LABEL_PREFIX = {C10D: "", FUNCOL: "funcol.", OPS: "_c10d_functional.", PG_OPS: "c10d.",
                 SYMM_MEM: "symm_mem."}


def _c10d(api: str, eager_name: str | None, kernels: tuple[str, ...] = (), **rules) -> Collective:
    return Collective(api, C10D, eager_name, kernels=frozenset(kernels), **rules)


def _funcol(api: str, eager_name: str, kernels: tuple[str, ...], **rules) -> Collective:
    return Collective(
        api, FUNCOL, eager_name, kernels=frozenset(kernels), group_arg=GroupArg.ANY, **rules
    )


def _op(api: str, eager_name: str, kernels: tuple[str, ...], **rules) -> Collective:
    return Collective(api, OPS, eager_name, kernels=frozenset(kernels), group_arg=GroupArg.ANY,
                      group_param="group_name", **rules)


def _pg_op(api: str, eager_name: str, kernels: tuple[str, ...], **rules) -> Collective:
    return Collective(api, PG_OPS, eager_name, kernels=frozenset(kernels),
                      group_arg=GroupArg.BOXED, group_param="process_group", **rules)


def _symm(api: str, eager_name: str, kernels: tuple[str, ...], **rules) -> Collective:
    return Collective(api, SYMM_MEM, f"symm_mem::{eager_name}", kernels=frozenset(kernels),
                      group_arg=GroupArg.ANY, group_param="group_name",
                      records_group_ranks=False, **rules)


_ALL_REDUCE = dict(inputs="tensor", complex_as_real=True, coalesced_name="allreduce_coalesced")
_GATHER_BASE = dict(
    inputs="input_tensor",
    outputs="output_tensor",
    sizes=Sizes.IN_OUT,
    complex_as_real=True,
    coalesced_name="allgather_into_tensor_coalesced",
)
_SCATTER_BASE = dict(
    inputs="input",
    outputs="output",
    sizes=Sizes.IN_OUT,
    coalesced_name="reduce_scatter_tensor_coalesced",
)
_BROADCAST = dict(inputs="tensor", rank=Rank.ROOT, root_params=("src", "group_src"))
_SEND = dict(inputs="tensor", rank=Rank.PEER, root_params=("dst", "group_dst"))
_RECV = dict(inputs="tensor", rank=Rank.PEER, root_params=("src", "group_src"))
# funcol's single-tensor ops pass complex tensors as view_as_real (measured on 2 x H200).
_F_GATHER = dict(inputs="self", sizes=Sizes.GATHER, complex_as_real=True)
_F_SCATTER = dict(inputs="self", sizes=Sizes.SHARD, complex_as_real=True)
_F_GATHER_LIST = dict(inputs="self", sizes=Sizes.GATHER)
_F_SCATTER_LIST = dict(inputs="inputs", sizes=Sizes.SHARD)
_F_A2A = dict(
    inputs="self",
    sizes=Sizes.SPLIT_ROWS,
    splits=Splits.EQUAL_IF_NONE,
)
_AG, _RS, _AR = (ALL_GATHER,), (REDUCE_SCATTER,), (ALL_REDUCE,)
# The ops pass complex tensors to the process group as view_as_real (Functional.cpp), and the
# "_out" forms launch what their c10d namesakes launch.
_O_BROADCAST = dict(inputs="input", rank=Rank.ROOT, root_params=("src",),
                    root_is_group_rank=True, complex_as_real=True)
_O_GATHER = dict(inputs="input", sizes=Sizes.GATHER, complex_as_real=True)
_O_SCATTER = dict(inputs="input", sizes=Sizes.SHARD, complex_as_real=True)
# The c10d:: ops get what the process group gets: complex tensors already viewed as real by
# the Python API, roots and peers as group ranks.
_PG_ROOT = dict(rank=Rank.ROOT, root_params=("root_rank",), root_is_group_rank=True)
_PG_PEER = dict(rank=Rank.PEER, root_is_group_rank=True)

#: Every wrapped function. Functions missing from the installed torch are skipped.
COLLECTIVES: tuple[Collective, ...] = (
    # torch.distributed (c10d)
    _c10d("all_reduce", "allreduce", _AR, **_ALL_REDUCE),
    _c10d("all_reduce_coalesced", "allreduce_coalesced", _AR, inputs="tensors",
          complex_as_real=True),
    _c10d("all_gather", "all_gather", (ALL_GATHER, BROADCAST), inputs="tensor",
          outputs="tensor_list", sizes=Sizes.GATHER, complex_as_real=True),
    _c10d("all_gather_into_tensor", "_allgather_base", _AG, **_GATHER_BASE),
    _c10d("all_gather_single", "_allgather_base", _AG, **_GATHER_BASE),
    _c10d("_all_gather_base", "_allgather_base", _AG, **_GATHER_BASE),
    _c10d("reduce_scatter", "reduce_scatter", _RS, inputs="input_list", outputs="output",
          sizes=Sizes.SCATTER, dtype_from="output"),
    _c10d("reduce_scatter_tensor", "_reduce_scatter_base", _RS, **_SCATTER_BASE),
    _c10d("reduce_scatter_single", "_reduce_scatter_base", _RS, **_SCATTER_BASE),
    _c10d("_reduce_scatter_base", "_reduce_scatter_base", _RS, **_SCATTER_BASE),
    _c10d("broadcast", "broadcast", (BROADCAST,), complex_as_real=True, **_BROADCAST),
    _c10d("reduce", "reduce", (REDUCE,), inputs="tensor", rank=Rank.ROOT,
          root_params=("dst", "group_dst")),
    _c10d("all_to_all_single", "all_to_allv", (SEND_RECV,), inputs="input", outputs="output",
          sizes=Sizes.IN_OUT, splits=Splits.GIVEN, complex_as_real=True),
    _c10d("all_to_all", "all_to_all", (SEND_RECV,), inputs="input_tensor_list",
          outputs="output_tensor_list", sizes=Sizes.ALL_TO_ALL, splits=Splits.NUMELS,
          complex_as_real=True),
    _c10d("gather", "gather", (SEND_RECV,), inputs="tensor", sizes=Sizes.GATHER,
          rank=Rank.ROOT, root_params=("dst", "group_dst")),
    _c10d("scatter", "scatter", (SEND_RECV,), outputs="tensor", sizes=Sizes.SCATTER,
          dtype_from="output", rank=Rank.ROOT, root_params=("src", "group_src"),
          complex_as_real=True),
    _c10d("send", "send", (SEND_RECV,), **_SEND),
    _c10d("isend", "send", (SEND_RECV,), complex_as_real=True, **_SEND),
    _c10d("recv", "recv", (SEND_RECV,), **_RECV),
    _c10d("irecv", "recv", (SEND_RECV,), complex_as_real=True, **_RECV),
    _c10d("barrier", "barrier", _AR, sizes=Sizes.ZERO, dtype_from="byte"),
    _c10d("batch_isend_irecv", None, (SEND_RECV,), role=Role.BATCH),
    _c10d("_coalescing_manager", None, (), role=Role.BLOCK),
    # torch.distributed._functional_collectives
    _funcol("all_reduce", "allreduce", _AR, inputs="self", complex_as_real=True),
    _funcol("all_reduce_coalesced", "allreduce_coalesced", _AR, inputs="self"),
    _funcol("broadcast", "broadcast", (BROADCAST,), inputs="self", rank=Rank.ROOT,
            root_params=("src",), root_is_group_rank=True, complex_as_real=True),
    *(
        _funcol(api, "allgather_into_tensor_coalesced", _AG, **_F_GATHER)
        for api in ("all_gather_tensor", "all_gather_tensor_autograd", "all_gather_single",
                    "all_gather_single_autograd")
    ),
    *(
        _funcol(api, "allgather_into_tensor_coalesced", _AG, **_F_GATHER_LIST)
        for api in ("all_gather_into_tensor_coalesced", "all_gather_single_coalesced")
    ),
    *(
        _funcol(api, "reduce_scatter_tensor_coalesced", _RS, **_F_SCATTER)
        for api in ("reduce_scatter_tensor", "reduce_scatter_tensor_autograd",
                    "reduce_scatter_single", "reduce_scatter_single_autograd")
    ),
    *(
        _funcol(api, "reduce_scatter_tensor_coalesced", _RS, **_F_SCATTER_LIST)
        for api in ("reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced")
    ),
    *(
        _funcol(api, "all_to_allv", (SEND_RECV,), **_F_A2A)
        for api in ("all_to_all_single", "all_to_all_single_autograd")
    ),
    # torch.ops._c10d_functional (what torch.compile'd code launches)
    *(_op(api, "allreduce", _AR, inputs="input", complex_as_real=True)
      for api in ("all_reduce", "all_reduce_")),
    *(_op(api, "allreduce_coalesced", _AR, inputs="inputs", complex_as_real=True)
      for api in ("all_reduce_coalesced", "all_reduce_coalesced_")),
    _op("all_gather_into_tensor", "allgather_into_tensor_coalesced", _AG, **_O_GATHER),
    _op("all_gather_into_tensor_coalesced", "allgather_into_tensor_coalesced", _AG,
        inputs="inputs", sizes=Sizes.GATHER),
    _op("all_gather_into_tensor_out", "_allgather_base", _AG, inputs="input", outputs="out",
        sizes=Sizes.IN_OUT),
    _op("reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", _RS, **_O_SCATTER),
    _op("reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced", _RS,
        inputs="inputs", sizes=Sizes.SHARD),
    _op("reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced", _RS, inputs="input",
        outputs="out", sizes=Sizes.IN_OUT, complex_as_real=True),
    _op("all_to_all_single", "all_to_allv", (SEND_RECV,), inputs="input",
        sizes=Sizes.SPLIT_ROWS, splits=Splits.EQUAL_IF_NONE),
    *(_op(api, "broadcast", (BROADCAST,), **_O_BROADCAST) for api in ("broadcast", "broadcast_")),
    # torch.ops.c10d (every ProcessGroup call: DDP's reducer, autograd, C++ and direct callers)
    _pg_op("allreduce_", "allreduce", _AR, inputs="tensors"),
    _pg_op("allreduce_coalesced_", "allreduce_coalesced", _AR, inputs="tensors"),
    _pg_op("allgather_", "all_gather", (ALL_GATHER, BROADCAST), inputs="input_tensors",
           outputs="output_tensors", sizes=Sizes.GATHER),
    _pg_op("_allgather_base_", "_allgather_base", _AG, inputs="input_tensor",
           outputs="output_tensor", sizes=Sizes.IN_OUT),
    _pg_op("allgather_coalesced_", "allgather_coalesced", _AG, inputs="input_list",
           outputs="output_lists", sizes=Sizes.GATHER),
    _pg_op("allgather_into_tensor_coalesced_", "allgather_into_tensor_coalesced", _AG,
           inputs="inputs", outputs="outputs", sizes=Sizes.IN_OUT),
    _pg_op("reduce_scatter_", "reduce_scatter", _RS, inputs="input_tensors",
           outputs="output_tensors", sizes=Sizes.SCATTER, dtype_from="output"),
    _pg_op("_reduce_scatter_base_", "_reduce_scatter_base", _RS, inputs="input_tensor",
           outputs="output_tensor", sizes=Sizes.IN_OUT),
    _pg_op("reduce_scatter_tensor_coalesced_", "reduce_scatter_tensor_coalesced", _RS,
           inputs="inputs", outputs="outputs", sizes=Sizes.IN_OUT),
    _pg_op("alltoall_", "all_to_all", (SEND_RECV,), inputs="input_tensors",
           outputs="output_tensors", sizes=Sizes.ALL_TO_ALL, splits=Splits.NUMELS),
    _pg_op("alltoall_base_", "all_to_allv", (SEND_RECV,), inputs="input", outputs="output",
           sizes=Sizes.IN_OUT, splits=Splits.GIVEN),
    _pg_op("barrier", "barrier", _AR, sizes=Sizes.ZERO, dtype_from="byte"),
    _pg_op("broadcast_", "broadcast", (BROADCAST,), inputs="tensors", **_PG_ROOT),
    _pg_op("reduce_", "reduce", (REDUCE,), inputs="tensors", **_PG_ROOT),
    _pg_op("gather_", "gather", (SEND_RECV,), inputs="input_tensors", sizes=Sizes.GATHER,
           **_PG_ROOT),
    _pg_op("scatter_", "scatter", (SEND_RECV,), outputs="output_tensors", sizes=Sizes.SCATTER,
           dtype_from="output", **_PG_ROOT),
    _pg_op("send", "send", (SEND_RECV,), inputs="tensors", root_params=("dst",), **_PG_PEER),
    _pg_op("recv_", "recv", (SEND_RECV,), inputs="tensors", root_params=("src",), **_PG_PEER),
    _pg_op("recv_any_source_", "recv", (SEND_RECV,), inputs="tensors", **_PG_PEER),
    # torch.ops.symm_mem: the collectives torch records (RECORD_PARAM_COMMS, torch >= 2.12,
    # CUDASymmetricMemoryOps.cu): "symm_mem::<name>", the input's and the output's numel, the
    # input's dtype, the caller's own rank, no global ranks (start and stride -1)
    _symm("one_shot_all_reduce", "one_shot_all_reduce", (ONE_SHOT,), inputs="input"),
    _symm("one_shot_all_reduce_out", "one_shot_all_reduce", (ONE_SHOT,), inputs="input",
          outputs="out", sizes=Sizes.IN_OUT),
    _symm("one_shot_all_reduce_copy", "one_shot_all_reduce", (ONE_SHOT,),
          inputs="symm_buffer", outputs="local_input", sizes=Sizes.IN_OUT),
    _symm("one_shot_all_reduce_copy_out", "one_shot_all_reduce", (ONE_SHOT,),
          inputs="symm_buffer", outputs="out", sizes=Sizes.IN_OUT),
    _symm("two_shot_all_reduce_", "two_shot_all_reduce", (TWO_SHOT,), inputs="input"),
    _symm("two_shot_all_reduce_out", "two_shot_all_reduce", (TWO_SHOT,), inputs="input"),
    _symm("multimem_all_reduce_", "multimem_all_reduce", (MULTIMEM_ALL_REDUCE,),
          inputs="input"),
    _symm("multimem_one_shot_all_reduce", "multimem_one_shot_reduce", (MULTIMEM_REDUCE,),
          inputs="input"),
    _symm("multimem_one_shot_all_reduce_out", "multimem_one_shot_reduce", (MULTIMEM_REDUCE,),
          inputs="input", outputs="out", sizes=Sizes.IN_OUT),
    _symm("multimem_one_shot_reduce_out", "multimem_one_shot_reduce", (MULTIMEM_REDUCE,),
          inputs="input", outputs="out", sizes=Sizes.IN_OUT),
    _symm("multimem_all_gather_out", "multimem_all_gather", (MULTIMEM_ALL_GATHER,),
          inputs="input", outputs="out", sizes=Sizes.IN_OUT),
    _symm("reduce_scatter_out", "reduce_scatter", (TWO_SHOT,), inputs="input",
          outputs="output", sizes=Sizes.IN_OUT),
)

BY_QUALNAME: dict[str, Collective] = {c.qualname: c for c in COLLECTIVES}


BY_LABEL: dict[str, Collective] = {c.label: c for c in COLLECTIVES}


def lookup(api: str) -> Collective:
    """The row of an API by label ("all_reduce", "funcol.all_reduce",
    "_c10d_functional.all_reduce_") or eager name ("allreduce")."""
    row = BY_LABEL.get(api)
    if row is not None:
        return row
    for row in COLLECTIVES:
        if row.eager_name == api and row.module == C10D:
            return row
    raise KeyError(f"unknown collective {api!r}")

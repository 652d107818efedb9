"""The eager profiler's vocabulary for NCCL collectives: key names, value formats, type names.

Everything here mirrors what torch's profiler writes on a ``record_param_comms`` op and copies
onto the NCCL kernel it launches (``saveNcclMeta`` in ``torch/csrc/profiler/util.cpp``):
ints stay ints, lists become strings such as ``"[0, 1]"``, dtypes are c10 ScalarType names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

COLLECTIVE_NAME = "Collective name"
IN_NELEMS = "In msg nelems"
OUT_NELEMS = "Out msg nelems"
GROUP_SIZE = "Group size"
DTYPE = "dtype"
IN_SPLIT = "In split size"
OUT_SPLIT = "Out split size"
#: What must agree across the ranks of one collective (sequences compare them; a rank's
#: published progress names its launches by them).
SEQUENCE_FIELDS = (COLLECTIVE_NAME, IN_NELEMS, OUT_NELEMS, DTYPE, IN_SPLIT, OUT_SPLIT)
PG_NAME = "Process Group Name"
PG_DESC = "Process Group Description"
PG_RANKS = "Process Group Ranks"
DST_RANK = "Dst Rank"
SRC_RANK = "Src Rank"
# Keys the profiler writes on the CPU ``record_param_comms`` op only (not on the kernel).
RANK = "Rank"
GLOBAL_RANK_START = "Global rank start"
GLOBAL_RANK_STRIDE = "Global rank stride"
# The tutorial's keys: the lane label and the lane (a pseudo stream id >= 60).
NAME = "name"
STREAM = "stream"

#: Keys on the eager NCCL kernel, in the order the profiler writes them.
KERNEL_KEYS: tuple[str, ...] = (
    COLLECTIVE_NAME,
    IN_NELEMS,
    OUT_NELEMS,
    GROUP_SIZE,
    DTYPE,
    IN_SPLIT,
    OUT_SPLIT,
    PG_NAME,
    PG_DESC,
    PG_RANKS,
    DST_RANK,
    SRC_RANK,
)
#: Keys the CPU op carries on top of the kernel keys.
CPU_ONLY_KEYS: tuple[str, ...] = (RANK, GLOBAL_RANK_START, GLOBAL_RANK_STRIDE)

#: The profiler prints at most this many list items (then "..., last").
TRUNCATE_LENGTH = 30

#: Lanes (pseudo stream ids) for process groups start here, above real CUDA stream ids.
FIRST_LANE = 60


def format_list(items: Sequence[Any]) -> str:
    """Format a list as the profiler does: ``"[1, 2]"``; past 30 items: the first 29, ``...``,
    the last."""
    if len(items) > TRUNCATE_LENGTH:
        head = ", ".join(str(int(x)) for x in items[: TRUNCATE_LENGTH - 1])
        return f"[{head}, ..., {int(items[-1])}]"
    return "[" + ", ".join(str(int(x)) for x in items) + "]"


EMPTY_LIST = format_list(())

_dtype_names: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """The c10 ScalarType name of a torch dtype (``torch.float32`` -> ``"Float"``), cached."""
    name = _dtype_names.get(dtype)
    if name is None:
        import torch

        # A tensor's legacy type string is "torch.<ScalarType>Tensor" (quantized ones sit in
        # "torch.quantized."): the same c10::toString the profiler uses.
        legacy = torch.empty(0, dtype=dtype).type()
        name = legacy.rsplit(".", 1)[-1].removesuffix("Tensor")
        _dtype_names[dtype] = name
    return name


def complex_as_real(dtype: Any) -> Any:
    """The real dtype c10d sends a complex tensor as (``view_as_real``)."""
    import torch

    return torch.empty(0, dtype=dtype).real.dtype

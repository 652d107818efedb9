"""Sizes and bandwidth: bytes per dtype, nccl-tests' bus-bandwidth factors, sizes as text.
A leaf: every reader, the analysis and the renderers use it, and it uses none of them."""

from __future__ import annotations

#: "dtype" (the profiler's name) -> bytes per element.
DTYPE_BYTES = {
    "Bool": 1, "Byte": 1, "Char": 1, "Short": 2, "Int": 4, "Long": 8, "Half": 2, "Float": 4,
    "Double": 8, "BFloat16": 2, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16,
    "UInt16": 2, "UInt32": 4, "UInt64": 8, "Float8_e5m2": 1, "Float8_e4m3fn": 1,
    "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1, "Float8_e8m0fnu": 1,
}

#: "Collective name" -> the nccl-tests bus-bandwidth family.
_FAMILY = {
    "allreduce": "allreduce", "allreduce_coalesced": "allreduce", "barrier": "allreduce",
    "all_gather": "allgather", "_allgather_base": "allgather",
    "allgather_into_tensor_coalesced": "allgather", "reduce_scatter": "reducescatter",
    "_reduce_scatter_base": "reducescatter", "reduce_scatter_tensor_coalesced": "reducescatter",
    "all_to_all": "alltoall", "all_to_allv": "alltoall", "broadcast": "broadcast",
    "reduce": "reduce",
}


def bus_factor(collective: str, ranks: int) -> float:
    family = _FAMILY.get(collective)
    if ranks <= 1 or family is None:
        return 1.0
    if family == "allreduce":
        return 2 * (ranks - 1) / ranks
    if family in ("allgather", "reducescatter", "alltoall"):
        return (ranks - 1) / ranks
    return 1.0


def size_text(n: float) -> str:
    """'512 B', '4.0 KiB', '1.5 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)

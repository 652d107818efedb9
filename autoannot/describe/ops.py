"""The table's operators as this torch has them (``c10d::`` and ``_c10d_functional::``): what
the observers below the Python API see a launch come through, and how its arguments are read."""

from __future__ import annotations

from typing import Any, NamedTuple

from autoannot.describe import collectives, metadata


class Op(NamedTuple):
    """One operator of the table: its row, the plan that derives its launches, its
    keyword-only arguments, and the positions of the arguments its metadata is read from."""

    row: collectives.Collective
    plan: metadata.Plan | None
    keyword_only: tuple[str, ...]
    read: list[int]


def table_ops() -> dict[str, Op]:
    """``"c10d::allreduce_"`` -> its ``Op``, for every operator of the table this torch has
    (imports torch)."""
    import torch

    found = {}
    for row in collectives.COLLECTIVES:
        if row.module not in collectives.OP_MODULES:
            continue
        namespace = getattr(torch.ops, "c10d" if row.module == collectives.PG_OPS
                            else "_c10d_functional")
        try:
            op = getattr(namespace, row.api).default
        except AttributeError:  # not in this torch
            continue
        arguments = [arg.name for arg in op._schema.arguments]
        read = {row.group_param, row.inputs, row.outputs, *row.root_params, *row.split_params}
        keyword_only = tuple(arg.name for arg in op._schema.arguments if arg.kwarg_only)
        found[op.name()] = Op(row, metadata.Plan(row, op), keyword_only,
                              [i for i, name in enumerate(arguments) if name in read])
    return found


def ops_by_collective(ops: dict[str, Op]) -> dict[str, str]:
    """Each eager collective name -> the ``c10d::`` op that launches it (a launch seen only by
    its process group's record is labelled by it)."""
    found: dict[str, str] = {}
    for name, op in ops.items():
        if op.row.module == collectives.PG_OPS and op.row.eager_name:
            found.setdefault(op.row.eager_name, name)
    return found


def call_of(op: Op, values: list[Any]) -> tuple[tuple, dict]:
    """An operator's arguments, as the native observer hands them (positional, then its
    keyword-only ones), as a call's ``(args, kwargs)``."""
    split = len(values) - len(op.keyword_only)
    return tuple(values[:split]), dict(zip(op.keyword_only, values[split:], strict=True))

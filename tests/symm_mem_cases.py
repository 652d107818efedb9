"""The symmetric-memory collectives on real gloo ranks (run by ``test_symm_mem.py``).

Torch runs ``torch.ops.symm_mem`` on CUDA only (and on Meta, for tracing). Here each op gets a
CPU kernel of the test's own that does what the CUDA one does, through the same group's gloo
collectives, so that a call is a real launch on a real group. What torch records for each
(``RECORD_PARAM_COMMS`` in ``CUDASymmetricMemoryOps.cu``, torch >= 2.12) is written out below,
op by op, from that source: the expectations are torch's, not the agent's table.
"""

from __future__ import annotations

import os
from typing import Any

#: op -> (torch's "Collective name", In msg nelems, Out msg nelems) as functions of the call's
#: tensors (CUDASymmetricMemoryOps.cu: what each op passes to RECORD_PARAM_COMMS).
RECORDED = {
    "one_shot_all_reduce": ("one_shot_all_reduce", "input", "input"),  # out: empty_like(input)
    "one_shot_all_reduce_out": ("one_shot_all_reduce", "input", "out"),
    "one_shot_all_reduce_copy": ("one_shot_all_reduce", "symm_buffer", "local_input"),
    "one_shot_all_reduce_copy_out": ("one_shot_all_reduce", "symm_buffer", "out"),
    "two_shot_all_reduce_": ("two_shot_all_reduce", "input", "input"),
    "two_shot_all_reduce_out": ("two_shot_all_reduce", "input", "input"),  # (input's, twice)
    "multimem_all_reduce_": ("multimem_all_reduce", "input", "input"),
    "multimem_one_shot_all_reduce": ("multimem_one_shot_reduce", "input", "input"),
    "multimem_one_shot_all_reduce_out": ("multimem_one_shot_reduce", "input", "out"),
    "multimem_one_shot_reduce_out": ("multimem_one_shot_reduce", "input", "out"),
    "multimem_all_gather_out": ("multimem_all_gather", "input", "out"),
    "reduce_scatter_out": ("reduce_scatter", "input", "output"),
}

#: c10's ScalarType names of the dtypes the calls use (what the profiler writes as "dtype").
C10_NAMES = {"torch.float32": "Float", "torch.bfloat16": "BFloat16", "torch.float16": "Half"}


def _cpu_kernels() -> Any:
    """CPU kernels for the ops, doing what their CUDA kernels do through gloo."""
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group as resolve

    def summed(tensor: Any, group_name: str) -> Any:
        dist.all_reduce(tensor, group=resolve(group_name))
        return tensor

    def copied_into(out: Any, tensor: Any, group_name: str) -> Any:
        out.copy_(tensor)
        return summed(out, group_name)

    def reduce_to(input: Any, op: str, root: int, group_name: str, out: Any) -> Any:
        total = summed(input.clone(), group_name)
        if resolve(group_name).rank() == root:
            out.copy_(total)
        return out

    def gather(input: Any, group_name: str, out: Any) -> Any:
        dist.all_gather_into_tensor(out, input, group=resolve(group_name))
        return out

    def scatter(input: Any, group_name: str, split_last_dim: bool, output: Any) -> Any:
        dist.reduce_scatter_tensor(output, input, group=resolve(group_name))
        return output

    kernels = {
        "one_shot_all_reduce": lambda x, op, g: summed(x.clone(), g),
        "one_shot_all_reduce_out": lambda x, op, g, out: copied_into(out, x, g),
        "one_shot_all_reduce_copy": lambda buf, local, op, g: summed(local.clone(), g),
        "one_shot_all_reduce_copy_out": lambda buf, local, op, g, out: copied_into(out, local, g),
        "two_shot_all_reduce_": lambda x, op, g: summed(x, g),
        "two_shot_all_reduce_out": lambda x, op, g, out: copied_into(out, x, g),
        "multimem_all_reduce_": lambda x, op, g: summed(x, g),
        "multimem_one_shot_all_reduce": lambda x, op, g: summed(x.clone(), g),
        "multimem_one_shot_all_reduce_out": lambda x, op, g, out: copied_into(out, x, g),
        "multimem_one_shot_reduce_out": reduce_to,
        "multimem_all_gather_out": gather,
        "reduce_scatter_out": scatter,
    }
    library = torch.library.Library("symm_mem", "IMPL")
    for name, kernel in kernels.items():
        library.impl(name, kernel, "CPU")
    return library


def _calls(rank: int, world: int, group_name: str) -> list[tuple[str, dict[str, Any]]]:
    """One call of each op: (op, its arguments by name), sizes and dtypes varied."""
    import torch

    def t(n: int, dtype: Any = torch.float32) -> Any:
        return torch.arange(n, dtype=dtype) + rank

    g = group_name
    return [
        ("one_shot_all_reduce", dict(input=t(8), reduce_op="sum", group_name=g)),
        ("one_shot_all_reduce_out", dict(input=t(6, torch.bfloat16), reduce_op="sum",
                                         group_name=g, out=t(6, torch.bfloat16))),
        ("one_shot_all_reduce_copy", dict(symm_buffer=t(16), local_input=t(12),
                                          reduce_op="sum", group_name=g)),
        ("one_shot_all_reduce_copy_out", dict(symm_buffer=t(16), local_input=t(10),
                                              reduce_op="sum", group_name=g, out=t(10))),
        ("two_shot_all_reduce_", dict(input=t(4, torch.float16), reduce_op="sum",
                                      group_name=g)),
        ("two_shot_all_reduce_out", dict(input=t(12), reduce_op="sum", group_name=g,
                                         output=t(12))),
        ("multimem_all_reduce_", dict(input=t(20), reduce_op="sum", group_name=g)),
        ("multimem_one_shot_all_reduce", dict(input=t(14, torch.bfloat16), reduce_op="sum",
                                              group_name=g)),
        ("multimem_one_shot_all_reduce_out", dict(input=t(2), reduce_op="sum", group_name=g,
                                                  out=t(2))),
        ("multimem_one_shot_reduce_out", dict(input=t(18), reduce_op="sum", root=world - 1,
                                              group_name=g, out=t(18))),
        ("multimem_all_gather_out", dict(input=t(5), group_name=g, out=t(5 * world))),
        ("reduce_scatter_out", dict(input=t(8 * world), group_name=g, split_last_dim=False,
                                    output=t(8))),
    ]


def expected(op: str, arguments: dict[str, Any], group: Any) -> dict[str, Any]:
    """What torch's record of this call holds (the kernel's keys, then the CPU op's "Rank")."""
    name, given, made = RECORDED[op]
    out_nelems = arguments[made].numel()
    keys = {"Collective name": f"symm_mem::{name}", "In msg nelems": arguments[given].numel(),
            "Out msg nelems": out_nelems, "Group size": group.size(),
            "dtype": C10_NAMES[str(arguments[given].dtype)],
            "In split size": "[]", "Out split size": "[]",
            "Process Group Name": group.group_name, "Process Group Description": group.group_desc,
            # start and stride -1: ParamCommsDebugInfo builds no ranks; the profiler writes
            # neither "Global rank start" nor "Global rank stride"
            "Process Group Ranks": "[]"}
    return {**keys, "Rank": group.rank()}


def every_op(rank: int, world: int, compiled: bool = False) -> dict[str, Any]:
    """Each op called on the default group and on a group of its own (agent off once, for the
    results): what ``record()`` and the record file hold, what torch records, the results."""
    import json

    import torch
    import torch.distributed as dist

    import autoannot
    from autoannot.agent.instrumentation import INSTRUMENTATION

    library = _cpu_kernels()
    namespace = torch.ops.symm_mem
    packets = {op: namespace.__dict__.get(op) or getattr(namespace, op) for op in RECORDED}
    defaults = {op: packet.default for op, packet in packets.items()}
    own = dist.new_group(list(range(world)))
    groups = [dist.group.WORLD, own]

    def run_all(calls_of: Any) -> list[Any]:
        results = []
        for group in groups:
            for i, (op, arguments) in enumerate(calls_of(group)):
                target = getattr(torch.ops.symm_mem, op)
                if i % 2:  # the overload, as compiled code calls it
                    target = target.default
                results.append(target(**arguments))
        return results

    def calls_of(group: Any) -> list[tuple[str, dict[str, Any]]]:
        return _calls(rank, world, group.group_name)

    off = [r.tolist() for r in run_all(calls_of)]
    autoannot.enable()
    with autoannot.record() as records:
        on = [r.tolist() for r in run_all(calls_of)]
    truth = [expected(op, arguments, group) for group in groups
             for op, arguments in calls_of(group)]
    agent_kernels = [op for op in RECORDED  # (the Python layer's key: none on these ops)
                     if torch._C._dispatch_has_kernel_for_dispatch_key(f"symm_mem::{op}",
                                                                       "DeferredInit")]
    journal = []
    if os.environ.get("AUTOANNOT_RECORD"):
        with open(os.environ["AUTOANNOT_RECORD"].replace("{rank}", str(rank))) as lines:
            journal = [json.loads(line) for line in lines]
    autoannot.disable()
    restored = all(namespace.__dict__.get(op) is packets[op]
                   and packets[op].__dict__.get("default") is defaults[op] for op in RECORDED)
    del library
    return {
        "records": [(r.api, r.annotation) for r in records],
        "cpu_only": [r.cpu_only for r in records],
        "truth": truth, "ops": [op for _ in groups for op in RECORDED],
        "same_results": on == off, "restored": restored, "agent_kernels": agent_kernels,
        "journal": journal, "hooks": INSTRUMENTATION.hooks is not None,
    }


def compiled(rank: int, world: int) -> dict[str, Any]:
    """A function calling two ops (those with a Meta kernel, which tracing needs), compiled
    whole (``aot_eager``: Inductor lowers these ops for CUDA only): each launch of the compiled
    code recorded as the eager call is, no graph break, the same result."""
    import torch
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    import autoannot

    library = _cpu_kernels()
    name = dist.group.WORLD.group_name

    def step(x: Any) -> Any:
        y = torch.ops.symm_mem.one_shot_all_reduce(x * 2, "sum", name)
        return torch.ops.symm_mem.one_shot_all_reduce_copy.default(y, y[:6] + 1, "sum", name)

    x = torch.arange(8, dtype=torch.float32) + rank
    autoannot.enable()
    with autoannot.record() as eager:
        expected_result = step(x.clone())
    counters.clear()
    run = torch.compile(step, backend="aot_eager", fullgraph=True)
    with autoannot.record() as records:
        result = run(x.clone())
    autoannot.disable()
    del library
    return {"eager": [(r.api, r.annotation) for r in eager],
            "compiled": [(r.api, r.annotation) for r in records],
            "graph_breaks": sum(counters["graph_break"].values()),
            "same_result": torch.equal(result, expected_result)}

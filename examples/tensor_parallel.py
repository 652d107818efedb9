"""A tensor-parallel MLP block on 2 CPU ranks (gloo), with no autoannot code in it.

    AUTOANNOT=1 python examples/tensor_parallel.py

The block is Megatron-style with sequence parallelism: all-gather the sequence shards, a
column-parallel linear, a row-parallel linear, reduce-scatter back to sequence shards (the
backward pass runs the mirror all-gather, launched by autograd from C++: annotated through the
dispatcher); the replicated bias is broadcast at start and its gradient all-reduced. Run with
``AUTOANNOT=1`` and every Python process (the spawned ranks included) is instrumented: this
script then prints the annotation the agent attached to each collective, read from
``AUTOANNOT_RECORD`` files.

    AUTOANNOT=1 AUTOANNOT_RECORD='run/rank{rank}.jsonl' \
        python examples/tensor_parallel.py --trace run/

``--trace DIR`` also profiles each rank (torch's profiler, CPU) and exports its trace as
``DIR/trace_rank{rank}.json``; the agent writes the rows of its collectives beside it
(``trace_rank{rank}.rows.parquet`` with pyarrow).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp

HIDDEN, FFN, SEQ, BATCH = 16, 32, 8, 2


class TensorParallelMLP(torch.nn.Module):
    """y = W2 gelu(W1 x) + b, W1 split by columns and W2 by rows over the group."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.group, world = group, group.size()
        self.w1 = torch.nn.Parameter(torch.randn(FFN // world, HIDDEN) / HIDDEN**0.5)
        self.w2 = torch.nn.Parameter(torch.randn(HIDDEN, FFN // world) / FFN**0.5)
        self.bias = torch.nn.Parameter(torch.zeros(HIDDEN))  # replicated

    def forward(self, x_shard: torch.Tensor) -> torch.Tensor:
        x = funcol.all_gather_tensor_autograd(x_shard, 0, self.group)  # [SEQ, BATCH, HIDDEN]
        h = torch.nn.functional.gelu(x @ self.w1.t())
        partial = h @ self.w2.t()  # partial sums over the FFN shards
        out = funcol.reduce_scatter_tensor_autograd(partial, "sum", 0, self.group)
        return out + self.bias


def step(block: TensorParallelMLP, tp: dist.ProcessGroup, world: int) -> None:
    dist.broadcast(block.bias.data, src=0, group=tp)  # replicated parameters start equal
    x_shard = torch.randn(SEQ // world, BATCH, HIDDEN)
    loss = block(x_shard).square().mean()
    loss.backward()
    dist.all_reduce(block.bias.grad, group=tp)  # the replicated bias: sum its gradients
    dist.barrier()


def worker(rank: int, world: int, port: int, trace: str | None) -> None:
    warnings.simplefilter("ignore", FutureWarning)  # torch 2.13 renamed a few collectives
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    tp = dist.new_group(list(range(world)), group_desc="tp")
    torch.manual_seed(0)
    block = TensorParallelMLP(tp)
    if trace is None:
        step(block, tp, world)
    else:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(block, tp, world)
        prof.export_chrome_trace(str(Path(trace) / f"trace_rank{rank}.json"))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    world = 2
    trace = None
    if sys.argv[1:2] == ["--trace"] and len(sys.argv) == 3:
        trace = sys.argv[2]
        Path(trace).mkdir(parents=True, exist_ok=True)
    elif sys.argv[1:]:
        print("usage: python examples/tensor_parallel.py [--trace DIR]", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as records:
        os.environ.setdefault("AUTOANNOT_RECORD", str(Path(records) / "rank{rank}.jsonl"))
        mp.spawn(worker, args=(world, free_port(), trace), nprocs=world)
        template = os.environ["AUTOANNOT_RECORD"]
        if not any(Path(template.format(rank=r, pid="*")).exists() for r in range(world)):
            # (no record file: the agent was not on in the ranks, whatever AUTOANNOT says)
            print("Ran without the agent. Run with AUTOANNOT=1 to see the annotations.")
            return 0
        for rank in range(world):
            path = Path(template.format(rank=rank, pid="*"))
            lines = path.read_text().splitlines() if path.exists() else []
            print(f"rank {rank}: {len(lines)} collectives annotated")
            for line in lines:
                record = json.loads(line)
                site = record["call_site"].rsplit("/", 1)[-1]
                print(f"  {record['api']:32} {site:24} {json.dumps(record['annotation'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

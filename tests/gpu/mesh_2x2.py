"""On 4 GPUs: a 2x2 mesh ("dp", "tp") step captured into one CUDA graph, both groups in flight.

    AUTOANNOT=1 PYTHONPATH=autoannot/_hook:. python tests/gpu/mesh_2x2.py OUT_DIR [WORLD]

The step: a tensor-parallel MLP (all_gather of the sequence shards, column- and row-parallel
matmuls, all_reduce of the partial sums) on the "tp" group, while on a side stream the
data-parallel part (reduce_scatter of a gradient bucket, all_gather of the parameter shards)
runs on the "dp" group: collectives of the two groups are in flight together. Each rank profiles
the step eagerly, then captures it (profiler off) and profiles 3 replays. The step holds no
autoannot code. WORLD=2 runs the same script on 2 GPUs as a 2x1 mesh; on the CPU, the gloo
twin is ``tests/test_mesh_cpu.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from harness import launch_on_gpus

REPLAYS = 3
HIDDEN, FFN, TOKENS, BUCKET = 256, 1024, 512, 1 << 16


def make_step(mesh, device: torch.device):
    """The step's tensors and the step itself (no autoannot code)."""
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    tp_size, dp_size = tp.size(), dp.size()
    torch.manual_seed(1234)
    x_shard = torch.randn(TOKENS // tp_size, HIDDEN, device=device)
    x_full = torch.empty(TOKENS, HIDDEN, device=device)
    w1 = torch.randn(HIDDEN, FFN // tp_size, device=device) / HIDDEN**0.5
    w2 = torch.randn(FFN // tp_size, HIDDEN, device=device) / FFN**0.5
    grads = torch.randn(BUCKET, device=device)
    grad_shard = torch.empty(BUCKET // dp_size, device=device)
    param_shard = torch.randn(BUCKET // dp_size, device=device)
    params = torch.empty(BUCKET, device=device)
    side = torch.cuda.Stream(device)

    def step() -> torch.Tensor:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # data parallel, concurrently with tensor parallel
            dist.reduce_scatter_tensor(grad_shard, grads, group=dp)
            dist.all_gather_into_tensor(params, param_shard, group=dp)
        dist.all_gather_into_tensor(x_full, x_shard, group=tp)
        h = torch.relu(x_full @ w1)
        y = h @ w2
        dist.all_reduce(y, group=tp)
        torch.cuda.current_stream().wait_stream(side)
        return y

    return step


def worker(rank: int, world: int, out_dir: str, port: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    mesh = init_device_mesh("cuda", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    step = make_step(mesh, device)
    out = Path(out_dir)

    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(warm)
    torch.cuda.synchronize()

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as eager:
        step()
        torch.cuda.synchronize()
    eager.export_chrome_trace(str(out / f"eager_rank{rank}.json"))

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as graphed:
        for _ in range(REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
    graphed.export_chrome_trace(str(out / f"graph_rank{rank}.json"))
    torch.cuda.synchronize()
    sys.stdout.flush()
    os._exit(0)  # NCCL teardown with live graphs can hang; the traces are written


def main() -> int:
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "mesh_out")
    if not launch_on_gpus(worker, world, out):
        return 2
    print("traces written to", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""On 2 GPUs with NCCL: graphed collectives must carry the eager kernel args after annotation.

    AUTOANNOT=1 PYTHONPATH=autoannot/_hook:. python tests/gpu/graph_replay.py OUT_DIR

Each rank runs two bodies of collectives (two process groups; every graphable call of the
golden set) eagerly under the profiler, then captures them into two CUDA graphs (G1 on the
default capture stream, G2 on a side stream; both captured while the profiler is off) and
profiles 3 replays of each. The bodies hold no autoannot code: the agent is on through
``AUTOANNOT=1``. The exported traces get ledger files next to them; a second export of the same
profile is annotated in the job (``AUTOANNOT_ANNOTATE_ON_EXPORT=1``). Then the traces are
annotated offline and every NCCL kernel of every replay is compared with the eager kernel of
the same call. Prints the counts; exits 1 on any difference.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from harness import launch_on_gpus

REPLAYS = 3


def bodies(rank: int, world: int, tp: dist.ProcessGroup):
    dev = torch.device("cuda", rank)
    x = torch.randn(1 << 16, device=dev)
    out = torch.empty(world << 16, device=dev)
    a, b = torch.randn(1 << 12, device=dev), torch.empty(1 << 12, device=dev)
    xb = torch.randn(1 << 13, device=dev, dtype=torch.bfloat16)
    xl = torch.ones(333, device=dev, dtype=torch.int64)
    xh = torch.randn(1000, device=dev, dtype=torch.float16)
    w = torch.randn(256, 256, device=dev)
    peer = 1 - rank

    def g1() -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y)
        dist.all_gather_into_tensor(out, y, group=tp)
        h = w @ w
        dist.all_reduce(xb, op=dist.ReduceOp.MAX, group=tp)
        dist.reduce_scatter_tensor(y, out)
        dist.all_to_all_single(b, a, group=tp)
        dist.all_reduce(h, async_op=True).wait()
        dist.all_reduce(xl, group=tp)
        return y

    def g2() -> None:
        dist.broadcast(a, 0, group=tp)
        dist.reduce(b, 1)
        if rank == 0:
            dist.send(a, peer)
        else:
            dist.recv(a, peer)
        dist.all_reduce(xh, op=dist.ReduceOp.MIN, group=tp)
        dist.all_gather_into_tensor(out, x)

    return g1, g2


def worker(rank: int, world: int, out_dir: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    tp = dist.new_group(list(range(world)), group_desc="tp")
    g1, g2 = bodies(rank, world, tp)
    out = Path(out_dir)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up NCCL and the allocator off the default stream
        for _ in range(2):
            g1()
            g2()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as eager:
        g1()
        g2()
        torch.cuda.synchronize()
    eager.export_chrome_trace(str(out / f"eager_rank{rank}.json"))

    graph1, graph2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph1):
        g1()
    with torch.cuda.graph(graph2, stream=torch.cuda.Stream()):
        g2()
    for _ in range(2):
        graph1.replay()
        graph2.replay()
    torch.cuda.synchronize()

    for name in ("graph", "inline"):  # "inline": each rank annotates its own trace on export
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as graphed:
            for _ in range(REPLAYS):
                graph1.replay()
                graph2.replay()
            torch.cuda.synchronize()
        if name == "inline":
            os.environ["AUTOANNOT_ANNOTATE_ON_EXPORT"] = "1"
        graphed.export_chrome_trace(str(out / f"{name}_rank{rank}.json"))
        os.environ.pop("AUTOANNOT_ANNOTATE_ON_EXPORT", None)
    torch.cuda.synchronize()
    sys.stdout.flush()
    os._exit(0)  # NCCL teardown with live graphs can hang; the traces are written



def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_out")
    if not launch_on_gpus(worker, 2, out):
        return 2
    return verify(out, world=2, sizes=[7, 5])


def verify(out: Path, world: int, sizes: list[int]) -> int:
    """Annotate each rank's trace offline (and check the in-job one); compare with eager."""
    import verify_traces

    from autoannot.traces.read import annotate as tracetool

    ok, summary = True, []
    for rank in range(world):
        eager = verify_traces.eager_calls(out / f"eager_rank{rank}.json")
        bodies = verify_traces.split_bodies(eager, sizes)
        report = tracetool.annotate_file(out / f"graph_rank{rank}.json",
                                         out / f"annotated_rank{rank}.json")
        tracetool.annotate_file(out / f"graph_rank{rank}.json", out / f"rank{rank}.pftrace")
        offline = verify_traces.compare(out / f"annotated_rank{rank}.json", bodies)
        inline = verify_traces.compare(out / f"inline_rank{rank}.json", bodies)
        for result in (offline, inline):
            ok &= not result["problems"] and result["kernels"] > 0
        summary.append({"rank": rank, "report": report.as_dict(), "offline": offline,
                        "in_job": inline})
    print(json.dumps(summary, indent=1))
    print("VERIFIED" if ok else "DIFFERENCES FOUND")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""On 2 GPUs with NCCL: torch.compile(mode="reduce-overhead") replays its collectives in CUDA
graphs (cudagraph trees); after annotation they must carry the eager kernel args.

    AUTOANNOT=1 PYTHONPATH=autoannot/_hook:. python tests/gpu/compile_graphs.py OUT_DIR

The compiled body holds c10d and functional collectives on two process groups and no autoannot
code. Each rank (1) profiles the body's eager twin (the functional collectives Dynamo traces
the c10d calls to) for the reference kernel args, (2) compiles the body with
``fullgraph=True, mode="reduce-overhead"``, checks the results against eager, and profiles 3
calls (cudagraph-tree replays), and (3) profiles eager functional collectives on complex
tensors and compares their kernel args with the agent's records (the view-as-real rule). The
traces are annotated offline and every NCCL kernel of every replay is compared with the eager
kernel of the same call. Prints the counts; exits 1 on any difference.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from harness import launch_on_gpus

CALLS = 3
ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.CUDA]


class AsTraced:
    """The c10d calls below as Dynamo traces them (functional collective, then a copy)."""

    @staticmethod
    def all_reduce(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None) -> None:
        tensor.copy_(funcol.all_reduce(tensor, op.name.lower(), group or dist.group.WORLD))

    @staticmethod
    def all_gather_into_tensor(output: torch.Tensor, tensor: torch.Tensor,
                               group: Any = None) -> None:
        output.copy_(funcol.all_gather_tensor(tensor, 0, group or dist.group.WORLD))

    @staticmethod
    def reduce_scatter_tensor(output: torch.Tensor, tensor: torch.Tensor,
                              group: Any = None) -> None:
        output.copy_(funcol.reduce_scatter_tensor(tensor, "sum", 0, group or dist.group.WORLD))


def make_body(tp: dist.ProcessGroup):
    def body(x: torch.Tensor, w: torch.Tensor, h: torch.Tensor, c10d: Any = dist):
        world = dist.get_world_size()
        y = x * 2
        c10d.all_reduce(y)
        gathered = torch.empty(world * y.numel(), device=y.device, dtype=y.dtype)
        c10d.all_gather_into_tensor(gathered, y, group=tp)
        shard = torch.empty_like(y)
        c10d.reduce_scatter_tensor(shard, gathered)
        m = w @ w
        z = funcol.all_reduce(m, "max", tp)
        a = funcol.all_to_all_single(gathered, None, None, tp)
        b = funcol.broadcast(shard + 1, 1, dist.group.WORLD)
        hb = funcol.all_reduce(h, "min", tp)
        g = funcol.all_gather_tensor(hb, 0, dist.group.WORLD)
        return y, shard, z, a, b, g

    return body


def complex_calls(rank: int) -> list:
    dev = torch.device("cuda", rank)
    c = torch.randn(64, dtype=torch.complex64, device=dev)
    world = dist.group.WORLD
    ops = torch.ops._c10d_functional
    return [
        lambda: funcol.all_reduce(c, "sum", world),
        lambda: funcol.broadcast(c, 0, world),
        lambda: funcol.all_gather_tensor(c, 0, world),
        lambda: funcol.reduce_scatter_tensor(c, "sum", 0, world),
        lambda: ops.all_reduce_.default(c.clone(), "sum", world.group_name),
        lambda: ops.all_reduce.default(c, "avg", world.group_name),
    ]


def worker(rank: int, world: int, out_dir: str, port: int) -> None:
    import autoannot

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    tp = dist.new_group(list(range(world)), group_desc="tp")
    out = Path(out_dir)
    dev = torch.device("cuda", rank)
    x = torch.arange(1 << 14, device=dev, dtype=torch.float32) % 7 + rank
    w = (torch.arange(128 * 128, device=dev) % 5).float().view(128, 128)
    h = torch.arange(4096, device=dev).to(torch.bfloat16)
    body = make_body(tp)
    report: dict[str, Any] = {"rank": rank, "agent_on": autoannot.is_enabled()}

    for _ in range(2):  # warm up NCCL
        body(x, w, h, AsTraced())
    torch.cuda.synchronize()
    with profile(activities=ACTIVITIES) as eager:
        reference = body(x, w, h, AsTraced())
        torch.cuda.synchronize()
    eager.export_chrome_trace(str(out / f"eager_rank{rank}.json"))

    from torch._dynamo.utils import counters

    compiled = torch.compile(body, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # compile, warm up, record the cudagraph tree
        results = compiled(x, w, h)
    torch.cuda.synchronize()
    report["graph_breaks"] = sum(counters["graph_break"].values())
    report["cudagraph_skips"] = dict(counters["inductor"]).get("cudagraph_skips", 0)
    report["bitwise_equal_to_eager"] = all(
        torch.equal(a, b) for a, b in zip(results, reference, strict=True))
    report["captures_seen"] = len(sys.modules["autoannot.capture"].LEDGERS)
    with profile(activities=ACTIVITIES) as graphed:
        for _ in range(CALLS):
            results = compiled(x, w, h)
        torch.cuda.synchronize()
    graphed.export_chrome_trace(str(out / f"graph_rank{rank}.json"))

    calls = complex_calls(rank)
    for call in calls:
        funcol.wait_tensor(call())
    torch.cuda.synchronize()
    with autoannot.record() as records, profile(activities=ACTIVITIES) as cplx:
        for call in calls:
            funcol.wait_tensor(call())
        torch.cuda.synchronize()
    cplx.export_chrome_trace(str(out / f"complex_rank{rank}.json"))
    report["complex_records"] = [
        {k: v for k, v in r.annotation.items() if k not in ("name", "stream")} for r in records]
    (out / f"report_rank{rank}.json").write_text(json.dumps(report))
    sys.stdout.flush()
    os._exit(0)  # NCCL teardown with live graphs can hang; the traces are written



def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_out")
    if not launch_on_gpus(worker, 2, out):
        return 2
    return verify(out, world=2)


def verify(out: Path, world: int) -> int:
    """Annotate each rank's compiled-replay trace offline; compare with the eager twin."""
    import verify_traces

    from autoannot.traces.read import annotate as tracetool

    ok, summary = True, []
    for rank in range(world):
        report = json.loads((out / f"report_rank{rank}.json").read_text())
        eager = verify_traces.eager_calls(out / f"eager_rank{rank}.json")
        annotate = tracetool.annotate_file(out / f"graph_rank{rank}.json",
                                           out / f"annotated_rank{rank}.json")
        replays = verify_traces.compare(out / f"annotated_rank{rank}.json", [eager])
        complex_eager = verify_traces.eager_calls(out / f"complex_rank{rank}.json")
        complex_ok = complex_eager == report["complex_records"]
        ok &= (not replays["problems"] and replays["kernels"] == CALLS * len(eager)
               and report["graph_breaks"] == 0 and report["bitwise_equal_to_eager"]
               and complex_ok)
        summary.append({**report, "annotate": annotate.as_dict(), "replays": replays,
                        "complex_matches_eager": complex_ok,
                        "complex_eager": complex_eager})
    print(json.dumps(summary, indent=1))
    print("VERIFIED" if ok else "DIFFERENCES FOUND")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

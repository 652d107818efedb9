"""On 2 GPUs with NCCL: a rank that spins before each collective, eager and graphed — the
ground truth for ``autoannot skew``.

    AUTOANNOT=1 PYTHONPATH=autoannot/_hook:. python tests/gpu/skew_sleep.py OUT_DIR

Each rank runs the same body: one small all-reduce that brings the ranks in step (the
profiler's start, a replay's launch, reach the ranks at different moments: that skew is
real, and lands there), then 4 all-reduces of two sizes on the same group; before each of
those, rank 1 runs ``torch.cuda._sleep`` (a spin kernel of a known length on its stream) and
rank 0 does not. (On two groups the second group's kernel on rank 0 would not wait for the
first's: its skew is not the spin.) The
body runs eagerly under the profiler (``eager_rank{r}.json``), then is captured into a CUDA graph
and replayed 3 times under the profiler (``graph_rank{r}.json`` and its ledger). Then each
rank's graph trace is annotated and ``autoannot skew`` runs on the eager pair and on the
annotated pair: every instance must name rank 1 as the last to arrive, its skew the length of
the spin kernel before it (within 10%). Exits 1 otherwise.
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

SPIN_CYCLES = 1_000_000  # ~0.5 ms on an H200
LATE = 1
REPLAYS = 3


SYNC_NUMEL = 8  # the in-step all-reduce: told apart by its size


def body(rank: int, x: torch.Tensor, y: torch.Tensor, tp: dist.ProcessGroup) -> None:
    # Both ranks spin first (eager: the CPU's launches then run ahead of the GPU, so the
    # kernels start when the GPU gets to them, as in a replay), then get in step.
    torch.cuda._sleep(4 * SPIN_CYCLES)
    dist.all_reduce(torch.ones(SYNC_NUMEL, device="cuda"), group=tp)
    for tensor in (x, y, x, y):
        if rank == LATE:
            torch.cuda._sleep(SPIN_CYCLES)
        dist.all_reduce(tensor, group=tp)


def worker(rank: int, world: int, out_dir: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    tp = dist.new_group([0, 1], group_desc="tp")
    out = Path(out_dir)
    x = torch.ones(1 << 20, device="cuda")
    y = torch.ones(1 << 12, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):  # NCCL warm-up
        body(rank, x, y, tp)
    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as eager:
        body(rank, x, y, tp)
        torch.cuda.synchronize()
    eager.export_chrome_trace(str(out / f"eager_rank{rank}.json"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body(rank, x, y, tp)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body(rank, x, y, tp)
    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as graphed:
        for _ in range(REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
    graphed.export_chrome_trace(str(out / f"graph_rank{rank}.json"))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # NCCL teardown with a live graph can hang; the traces are written


def check(out: Path) -> dict:
    """Annotate the graph traces; line up eager and graphed instances; compare with the
    spin kernels."""
    from autoannot.traces.analysis import lineup
    from autoannot.traces.read import annotate

    (out / "annotated").mkdir(exist_ok=True)
    for rank in (0, 1):
        annotate.annotate_file(out / f"graph_rank{rank}.json",
                               out / "annotated" / f"graph_rank{rank}.json")
    result = {}
    for kind, folder in (("eager", out), ("graphed", out / "annotated")):
        traces = [folder / f"{'graph' if kind == 'graphed' else 'eager'}_rank{r}.json"
                  for r in (0, 1)]
        analysis = lineup.analyze_files(traces, [])
        spins = spin_kernels(traces[LATE])
        rows = analysis.rows()
        checked = []
        for row in rows:
            if row["size_bytes"] == SYNC_NUMEL * 4:
                continue  # the in-step all-reduce
            start = row["ranks"][str(LATE)]["start_us"]
            before = [s for s in spins if s[1] <= start + 1.0]
            spin = before[-1][1] - before[-1][0] if before else None
            ok = (row["straggler"] == LATE and spin is not None
                  and abs(row["skew_us"] - spin) <= 0.1 * spin)
            checked.append({"group": row["group"], "seq": row["seq"],
                            "straggler": row["straggler"], "skew_us": row["skew_us"],
                            "spin_us": spin, "transfer_us": row["transfer_us"], "ok": ok})
        result[kind] = {"instances": checked, "problems": analysis.problems,
                        "all_ok": bool(checked) and all(c["ok"] for c in checked)}
    return result


def spin_kernels(trace: Path) -> list[tuple[float, float]]:
    doc = json.loads(trace.read_text())
    return sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]))
                  for e in doc["traceEvents"]
                  if isinstance(e, dict) and e.get("cat") == "kernel"
                  and "spin" in str(e.get("name", "")).lower()
                  and float(e["dur"]) < 2 * SPIN_CYCLES / 1e3)  # not the first, long one


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_out")
    if not launch_on_gpus(worker, 2, out):
        return 2
    result = check(out)
    (out / "run_output.txt").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    ok = result["eager"]["all_ok"] and result["graphed"]["all_ok"]
    print("VERIFIED" if ok else "DIFFERENCES FOUND")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

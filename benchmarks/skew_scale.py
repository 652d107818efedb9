"""``autoannot skew`` at scale: synthetic eager traces of a job of R ranks with N collectives
each (R x N rows), analysed on this machine; wall time and peak memory.

    python benchmarks/skew_scale.py [--ranks 1024] [--collectives 2000] [--dir DIR]

Each rank's trace holds N NCCL all-reduce kernels of the default group (Kineto's layout,
``distributedInfo`` naming the rank), each rank arriving a little apart (a known straggler
every 10th collective), a clock offset per rank, and nothing else. Prints one line of JSON.
A benchmark, not a test: it never fails on a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_traces(folder: Path, ranks: int, collectives: int) -> float:
    """The traces; returns their size in MiB."""
    rng = random.Random(0)
    kernel = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    total = 0
    for rank in range(ranks):
        offset = rng.uniform(-50.0, 50.0)  # this rank's clock
        events = []
        for i in range(collectives):
            base = 1_000_000.0 + 100.0 * i  # true time
            straggler = i % 10 == 0 and rank == i % ranks  # 30 us late
            start = base + (35.0 if straggler else rng.uniform(0.0, 5.0)) + offset
            end = base + 35.0 + 20.0 + rng.uniform(0.0, 0.5) + offset  # 20 us transfer
            events.append(
                f'{{"ph": "X", "cat": "kernel", "name": "{kernel}", "pid": 0, "tid": 7, '
                f'"ts": {start:.3f}, "dur": {end - start:.3f}, "args": {{"Collective name": '
                f'"allreduce", "In msg nelems": 1048576, "Out msg nelems": 1048576, '
                f'"Group size": {ranks}, "dtype": "Float", "Process Group Name": "0", '
                f'"Process Group Description": "default_pg"}}}}')
        text = ('{\n  "schemaVersion": 1,\n  "distributedInfo": {"backend": "nccl", "rank": '
                f'{rank}, "world_size": {ranks}}},\n  "traceEvents": [\n  '
                + ",\n  ".join(events) + "\n  ]\n}\n")
        (folder / f"rank{rank:04d}.json").write_text(text)
        total += len(text)
    return total / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--collectives", type=int, default=2000)
    parser.add_argument("--dir", help="where to write the traces (default: a temporary folder)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"writing {args.ranks} traces of {args.collectives} collectives ...",
              file=sys.stderr)
        mib = write_traces(folder, args.ranks, args.collectives)
        rows = Path(tmp) / "rows.json"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "autoannot.cli", "skew", str(folder),
                               "-j", str(args.jobs), "-q", "-o", str(rows)],
                              capture_output=True, text=True)
        seconds = time.perf_counter() - started
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        written = json.loads(rows.read_text()) if rows.exists() else []
        late = [r for r in written if r["seq"] % 10 == 0]
        # Ground truth: the late rank arrives 30-35 us after the others; the others within
        # 5 us of each other; clock offsets below 1 us (not taken out) may add up to 1 us.
        right = sum(r["straggler"] == r["seq"] % args.ranks and 29 <= r["skew_us"] <= 37
                    for r in late)
        in_step = sum(r["skew_us"] <= 7 for r in written if r["seq"] % 10)
        figures = {"ranks": args.ranks, "collectives_per_rank": args.collectives,
                   "rows": args.ranks * args.collectives, "traces_mib": round(mib),
                   "jobs": args.jobs, "seconds": round(seconds, 1),
                   "peak_mib_one_process": round(peak_mib), "exit": done.returncode,
                   "instances_written": len(written),
                   "late_rank_named_with_its_delay": f"{right}/{len(late)}",
                   "others_in_step": f"{in_step}/{len(written) - len(late)}"}
        if done.returncode not in (0, 1):
            print(done.stderr[-2000:], file=sys.stderr)
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``autoannot skew`` and ``autoannot report`` on the rows of a job of thousands of ranks:
wall time and peak memory of each command, on this machine.

    python benchmarks/report_scale.py [--ranks 8192] [--instances 2000] [--dir DIR]

Each rank's rows file (what a rank writes at trace export: ``autoannot/traces/table/rows.py``)
holds N all-reduces of the default group and of its 8-rank tensor-parallel group; every 10th
default-group instance has one rank 35 us late (rank = instance mod ranks); the others arrive
within 1.5 us of each other; each rank's clock is off by 1.5-3 us. Also prints the rows of
one rank of the committed 2 x H200 traces, and their size per instance. Prints one line of
JSON. A benchmark, not a test: it never fails on a figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from autoannot.traces.read import rank_files
from autoannot.traces.table import rows

TP = 8  # the tensor-parallel group's size


def write_rows(folder: Path, ranks: int, instances: int, straggler: int | None = None) -> float:
    """The rows files; their total size in MiB. ``straggler``: that rank alone is the late one
    (35 us, at every 10th default-group instance)."""
    rng = np.random.default_rng(0)
    half = instances // 2
    seq = np.concatenate([np.arange(half), np.arange(instances - half)])
    group = np.concatenate([np.zeros(half, np.uint32), np.ones(instances - half, np.uint32)])
    true_time = 1e6 + 100.0 * np.arange(instances)
    total = 0
    for rank in range(ranks):
        offset = rng.choice([-1.0, 1.0]) * rng.uniform(1.5, 3.0)  # this rank's clock: fitted
        start = true_time + rng.uniform(0.0, 1.5, instances) + offset  # in step: < 2 us
        late = (group == 0) & (seq % 10 == 0) & (
            seq % ranks == rank if straggler is None else np.full(instances, rank == straggler))
        start[late] = true_time[late] + 35.0 + offset
        end = true_time + 55.0 + rng.uniform(0.0, 0.5, instances) + offset
        columns = {
            "group": group, "seq": seq.astype(np.int64),
            "collective": np.zeros(instances, np.uint32),
            "size_bytes": np.where(group == 0, 1 << 22, 1 << 20).astype(np.int64),
            "start_us": start, "end_us": end,
            "site": group.astype(np.int32), "kernel": np.ones(instances, np.uint8),
            # a profiled window from step 1 on (step 0: warm-up), 20 steps
            "step": (1 + seq * 20 // max(1, half)).astype(np.int32),
            "dtype": np.zeros(instances, np.uint32)}
        tp = f"tp{rank // TP}"
        one = rows.Rows(rank, columns,
                        [{"name": "0", "desc": "default_pg", "size": ranks},
                         {"name": tp, "desc": "tensor_parallel", "size": TP}],
                        ["allreduce"], ["/job/train.py:88", "/job/model.py:212"],
                        run="bench", host=f"node{rank // 8}", source=f"rank{rank}.json",
                        dtypes=["BFloat16"])
        data = rows.encode(one)
        (folder / f"rank{rank:05d}.rows").write_bytes(data)
        total += len(data)
    return total / 2**20


def timed(command: list[str], said: Path,
          stderr: Path | None = None) -> tuple[float, float, int, str]:
    """Seconds, peak MiB and exit status of one command, and its standard output (kept in
    ``said``). The peak is the resident set of the whole process tree (the command and every
    process it starts: a pool's, a local cluster's), summed, sampled every 50 ms."""
    import psutil

    started = time.perf_counter()
    with open(said, "w") as out, open(stderr or os.devnull, "w") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err if stderr else None)
        root = psutil.Process(process.pid)
        peak = 0
        while process.poll() is None:
            total = 0
            with contextlib.suppress(psutil.NoSuchProcess):
                for one in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        total += one.memory_info().rss
            peak = max(peak, total)
            time.sleep(0.05)
    return time.perf_counter() - started, peak / 2**20, process.returncode, said.read_text()


def committed_rows() -> dict[str, object]:
    """Rows of rank 0 of the committed 2 x H200 traces (eager and graphed, annotated)."""
    data = Path(__file__).parent.parent / "tests" / "data" / "gpu" / "graphs"
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("eager_rank0.json", "graph_rank0.json"):
            trace = data / name
            readable = trace
            if name.startswith("graph"):
                from autoannot.traces.read import annotate

                readable = Path(tmp) / name
                annotate.annotate_file(trace, readable)
            one = rank_files.rows_of_trace(readable)
            assert one is not None
            size = len(rows.encode(one))
            width = sum(rows._WIDTH[code] for _, code in rows.COLUMNS)
            head = size - width * len(one)
            found[name] = {"instances": len(one), "bytes": size, "head_bytes": head,
                           "bytes_per_instance": round(size / len(one), 1),
                           "column_bytes_per_instance": width,
                           "trace_bytes_per_instance": round(trace.stat().st_size / len(one))}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8192)
    parser.add_argument("--instances", type=int, default=2000)
    parser.add_argument("--dir", help="where to write the rows (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="use the rows already in --dir "
                        "(written by an earlier run with the same --ranks and --instances)")
    parser.add_argument("--engine-args", default="", metavar="ARGS",
                        help="engine arguments given to skew and report, one string (e.g. "
                        "'--engine dask --workers 4 --worker-memory 3GB')")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.dir or tmp) / "rows"
        folder.mkdir(parents=True, exist_ok=True)
        print(f"writing {args.ranks} ranks' rows of {args.instances} instances ...",
              file=sys.stderr)
        started = time.perf_counter()
        if args.keep and any(folder.iterdir()):
            mib = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
        else:
            mib = write_rows(folder, args.ranks, args.instances)
        wrote_s = time.perf_counter() - started
        out = Path(tmp) / "out"
        cli = [sys.executable, "-m", "autoannot"]
        engine = shlex.split(args.engine_args)
        # (instance #0 is each group's first: warm-up, shown but not ranked)
        late_instances = len(range(10, args.instances // 2, 10))
        skew_s, skew_mib, skew_code, skew_said = timed(
            [*cli, "skew", str(folder), "-q", "--top", str(late_instances), *engine],
            Path(tmp) / "skew.txt")
        report_s, report_mib, report_code, _ = timed(
            [*cli, "report", str(folder), "-q", "-o", str(out / "report.html"), *engine],
            Path(tmp) / "report.txt")
        # the top instances by skew: the late ones, each naming its late rank and ~35 us
        top = re.findall(r"^default_pg \(0\)\s+(\d+)\s+allreduce\s+\S+ \S+\s+(\d+)\s+"
                         r"([\d.]+) us", skew_said, re.M)
        right = sum(int(seq) % 10 == 0 and int(last) == int(seq) % args.ranks
                    and 25 <= float(skew_us) <= 42 for seq, last, skew_us in top)
        matched = re.search(r"^(\d+) collective instances", skew_said, re.M)
        figures = {
            "ranks": args.ranks, "instances_per_rank": args.instances,
            "engine": " ".join(engine) or "embedded",
            "rows": args.ranks * args.instances, "rows_mib": round(mib),
            "rows_written_s": round(wrote_s, 1), "cores": os.cpu_count(),
            "skew": {"seconds": round(skew_s, 1), "peak_mib": round(skew_mib),
                     "exit": skew_code},
            "report": {"seconds": round(report_s, 1), "peak_mib": round(report_mib),
                       "exit": report_code,
                       "page_mib": round((out / "report.html").stat().st_size / 2**20, 1)
                       if (out / "report.html").exists() else None},
            "instances_matched": int(matched.group(1)) if matched else None,
            "late_rank_named_with_its_delay": f"{right}/{late_instances}",
            "committed_h200_rank0": committed_rows(),
        }
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``autoannot skew`` on a local Dask cluster as the job grows: 8,192 to 65,536 ranks, each with
N instances (half in the default group, half in its 8-rank tensor-parallel group, a late rank
planted at every 10th default-group instance: ``report_scale.write_rows``). Per size: the
wall time, the peak resident set of the whole process tree (the command, the scheduler, the
workers), each pass's tasks and their own times, and how many planted late ranks were named.
Then ``report`` at the largest size. Writes the figures (JSON) and a plot (PNG).

    python benchmarks/dask_scale.py [--ranks 8192 16384 32768 65536] [--instances 2002]
        [--workers 4] [--worker-memory 2GB] [--dir DIR] [--out FILE.json] [--plot FILE.png]

(2,002 instances: 100 planted late instances past warm-up.) A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent


def _scale_module():
    spec = importlib.util.spec_from_file_location("report_scale", HERE / "report_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def passes(stderr: str) -> dict[str, dict[str, float]]:
    """Each pass's line (``engines.said``): tasks, wall seconds, a task's median and most."""
    found = {}
    for label, tasks, wall, median, most in re.findall(
            r"autoannot: (\w+): (\d+) tasks in ([\d.]+) s; a task ([\d.]+) s \(median\), "
            r"([\d.]+) s \(most\)", stderr):
        found[label] = {"tasks": int(tasks), "wall_s": float(wall), "task_median_s":
                        float(median), "task_most_s": float(most)}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8192, 16384, 32768, 65536])
    parser.add_argument("--instances", type=int, default=2002)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--worker-memory", default="2GB")
    parser.add_argument("--dir", help="where to write the rows (default: a temporary folder)")
    parser.add_argument("--out", default=str(HERE / "results_dask_scale.json"))
    parser.add_argument("--plot", default=str(HERE.parent / "docs" / "dask_scale.png"))
    parser.add_argument("--no-report", action="store_true", help="skew only")
    args = parser.parse_args()
    scale = _scale_module()
    engine = ["--engine", "dask", "--workers", str(args.workers),
              "--worker-memory", args.worker_memory]
    cli = [sys.executable, "-m", "autoannot"]
    half = args.instances // 2
    planted = len(range(10, half, 10))
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in args.ranks:
            folder = Path(args.dir or tmp) / f"rows{ranks}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            print(f"{ranks} ranks: writing rows ...", file=sys.stderr)
            started = time.perf_counter()
            mib = scale.write_rows(folder, ranks, args.instances)
            wrote = time.perf_counter() - started
            said = Path(tmp) / f"skew{ranks}.txt"
            seconds, peak, code, text = scale.timed(
                [*cli, "skew", str(folder), "--top", str(planted), *engine], said,
                stderr=said.with_suffix(".err"))
            top = re.findall(r"^default_pg \(0\)\s+(\d+)\s+allreduce\s+\S+ \S+\s+(\d+)\s+"
                             r"([\d.]+) us", text, re.M)
            right = sum(int(seq) % 10 == 0 and int(last) == int(seq) % ranks
                        and 25 <= float(skew_us) <= 42 for seq, last, skew_us in top)
            point = {"ranks": ranks, "instances_per_rank": args.instances,
                     "launches": ranks * args.instances, "rows_mib": round(mib),
                     "rows_written_s": round(wrote, 1),
                     "skew": {"seconds": round(seconds, 1), "peak_mib": round(peak),
                              "exit": code,
                              "passes": passes(said.with_suffix(".err").read_text())},
                     "planted_late_named": f"{right}/{planted}"}
            if code:  # (what it said, where it failed)
                point["skew"]["said"] = said.with_suffix(".err").read_text()[-2000:]
            if ranks == max(args.ranks) and not args.no_report:
                page = Path(tmp) / "report.html"
                seconds, peak, code, _ = scale.timed(
                    [*cli, "report", str(folder), "-o", str(page), *engine],
                    Path(tmp) / "report.txt", stderr=Path(tmp) / "report.err")
                point["report"] = {"seconds": round(seconds, 1), "peak_mib": round(peak),
                                   "exit": code, "page_mib": round(page.stat().st_size / 2**20,
                                                                   1) if page.exists() else None}
            print(json.dumps(point), file=sys.stderr)
            points.append(point)
            shutil.rmtree(folder, ignore_errors=True)
    figures = {"cores": scale.os.cpu_count(), "workers": args.workers,
               "worker_memory": args.worker_memory, "points": points}
    Path(args.out).write_text(json.dumps(figures, indent=1) + "\n")
    plot(figures, Path(args.plot))
    print(json.dumps(figures))
    return 0


def plot(figures: dict, path: Path) -> None:
    import os

    os.environ.setdefault("MPLCONFIGDIR", tempfile.mkdtemp())  # (no font cache in ~/.cache)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = figures["points"]
    ranks = [p["ranks"] for p in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(ranks, [p["skew"]["seconds"] for p in points], "o-", label="skew, wall")
    for name in ("indexing", "matching"):
        left.plot(ranks, [p["skew"]["passes"].get(name, {}).get("wall_s", 0) for p in points],
                  "s--", label=f"{name} pass, wall")
    left.set_xscale("log", base=2)
    left.set_xlabel("ranks")
    left.set_ylabel("seconds")
    left.set_title(f"{figures['workers']} Dask workers on {figures['cores']} cores")
    left.legend()
    right.plot(ranks, [p["skew"]["passes"].get("matching", {}).get("task_median_s", 0)
                       for p in points], "o-", label="a matching task (median)")
    right.plot(ranks, [p["skew"]["passes"].get("matching", {}).get("tasks", 0) / 10
                       for p in points], "s--", label="matching tasks / 10")
    right.set_xscale("log", base=2)
    right.set_xlabel("ranks")
    right.set_title("per partition (about 4M launches)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    sys.exit(main())

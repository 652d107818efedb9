"""The watch as a user turns it on, run again and again: what it says of a 4-rank gloo mesh with
nothing planted, and of one where rank 2 is late before every all-reduce of its tp group.

    python benchmarks/watch_runs.py --runs 10 -o benchmarks/results_watch_runs.json

Each run is a job of its own (``tests/hang_jobs.py``: the 2 x 2 mesh, 4 processes) with
``AUTOANNOT=1 AUTOANNOT_WATCH=1`` alone — no ring folder (the run's folder under a temporary
folder of this script's), the default look (1 s) and stall (5 s). Nothing planted: 300 steps of
5 ms "compute"; planted: 400 steps, rank 2 sleeping 20 ms before each of its tp all-reduces.
For each run: every line the watch said, when (from the job's start, and from its first
collective), and for the planted runs the delay it named. Planted truth, never our own
figures: the delay is the sleep, the rank and group are the plant's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def one_run(kind: str, steps: int, folder: Path) -> dict:
    """One watched job, its lines read from rank 0's stderr as it ran."""
    import subprocess

    script = (f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); import hang_jobs\n"
              f"if __name__ == '__main__':\n"
              f"    from pathlib import Path\n"
              f"    hang_jobs.run({kind!r}, Path({str(folder)!r}), 60, record=None, "
              f"steps={steps})\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOANNOT")}
    env.update(AUTOANNOT="1", AUTOANNOT_WATCH="1", TMPDIR=str(folder))
    began = time.monotonic()
    job = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE,
                           stdout=subprocess.DEVNULL, text=True, cwd=folder)
    said = []
    assert job.stderr is not None
    for line in job.stderr:
        if line.startswith(("autoannot", "HANG", "  blocked")):
            said.append((round(time.monotonic() - began, 2), line.rstrip()))
    code = job.wait()
    runs = list((folder / f"autoannot-{os.getuid()}" / "runs").iterdir())
    first = None
    if len(runs) == 1:
        from autoannot.traces.read import ring_files

        first = min(float(ring_files.read(p).records["entered_ns"].min()) / 1e9
                    for p in ring_files.in_folder(runs[0])) - began
    return {"kind": kind, "steps": steps, "exit": code, "took_s": round(time.monotonic() -
                                                                         began, 1),
            "first_collective_s": None if first is None else round(first, 2), "said": said}


def summary(run: dict) -> dict:
    """What a person reads of a run: the straggler and hang lines, when, the delay named."""
    named = [(at, line) for at, line in run["said"] if "STRAGGLER" in line]
    out = {"straggler_lines": len(named),
           "hang_lines": sum("HANG" in line for _, line in run["said"]),
           "ended_lines": sum("no longer stands out" in line for _, line in run["said"])}
    if named:
        at, line = named[0]
        value, unit = line.split("the others waiting ")[1].split(" for it")[0].split()
        out.update(named_at_s=at, named_after_first_collective_s=round(
            at - run["first_collective_s"], 2) if run["first_collective_s"] else None,
            delay_ms=float(value) * (1e-3 if unit == "us" else 1.0),
            rank_group=line.split("STRAGGLER: ")[1].split(" arrived")[0] + " / " +
            line.split("of group ")[1].split("'s")[0])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    if args.output.exists():
        print(f"{args.output}: exists; name another", file=sys.stderr)
        return 2
    results = []
    for kind, steps in (("steady", 300), ("late_tp", 400)):
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="watch-run-") as folder:
                run = one_run(kind, steps, Path(folder))
            run["summary"] = summary(run)
            results.append(run)
            print(f"{kind} {i + 1}/{args.runs}: {json.dumps(run['summary'])}", flush=True)
    part = args.output.with_name(args.output.name + ".part")
    part.write_text(json.dumps(results, indent=1))
    part.rename(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())

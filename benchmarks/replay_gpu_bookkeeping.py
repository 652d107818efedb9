"""What a replay's GPU-times bookkeeping costs the host, on the CPU, against an older tree:
``GpuClock.replayed`` on the launching thread and the clock's look, per replay of a graph of
16 timed collectives (a planted source whose stamps all read at once: the host's work alone).

    python benchmarks/replay_gpu_bookkeeping.py OLD_TREE [--rounds 5]

``OLD_TREE``: a folder holding an older ``autoannot`` (``git archive REV autoannot | tar x -C
OLD_TREE``). Each tree runs in a process of its own, alternated ``--rounds`` times; prints the
medians (us a replay) and one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPLAYS, LAUNCHES = 200, 16


def measure() -> dict[str, float]:
    from autoannot.keep.gpu_clock import Captured, GpuClock

    class Planted:
        def capturing(self) -> bool:
            return False

        def stamp_ns(self, point: object, run: int) -> int:
            return 10_000 + run

        def done(self, event: object) -> bool:
            return True

        def anchor(self) -> int:
            return 0

        def ms_between(self, first: object, second: object) -> float:
            return 0.0

        def stamp_anchor(self) -> tuple[int, int, int]:  # (the code before 2026-12-07's)
            return (1_000, 0, 10)

        def launch_anchor(self) -> int:
            return 0

        def anchor_ns(self, anchor: int) -> int:
            return 1_000

    folder = tempfile.mkdtemp(prefix="autoannot-bookkeeping-")
    clock = GpuClock(os.path.join(folder, "rank0.ring.gpu"), 1 << 16, Planted(), thread=False)
    clock._graphs["g"] = [Captured(("point", i)) for i in range(LAUNCHES)]
    clock.anchor()
    replayed, looked = [], []
    for _ in range(30):
        started = time.perf_counter_ns()
        for i in range(REPLAYS):
            clock.replayed("g", i * LAUNCHES, LAUNCHES, 5)
        replayed.append((time.perf_counter_ns() - started) / REPLAYS / 1e3)
        started = time.perf_counter_ns()
        clock.look()
        looked.append((time.perf_counter_ns() - started) / REPLAYS / 1e3)
        if clock._pending:
            raise SystemExit("a look left replays unread")
    clock.close(0)
    return {"replayed_us": statistics.median(replayed), "look_us": statistics.median(looked)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--measure":
        print(json.dumps(measure()))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="a folder holding an older autoannot")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not (args.old / "autoannot").is_dir():
        parser.error(f"{args.old} holds no autoannot folder")
    found: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
            tree = args.old if name == "old" else ROOT
            out = subprocess.run([sys.executable, __file__, "--measure"], capture_output=True,
                                 text=True, check=True,
                                 env={**os.environ, "PYTHONPATH": str(tree)})
            found[name].append(json.loads(out.stdout))
    result = {name: {key: round(statistics.median(r[key] for r in runs), 2)
                     for key in ("replayed_us", "look_us")} for name, runs in found.items()}
    for name, row in result.items():
        print(f"{name}: replayed {row['replayed_us']} us a replay (launching thread), look "
              f"{row['look_us']} us a replay (clock's thread); {LAUNCHES} launches a replay")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

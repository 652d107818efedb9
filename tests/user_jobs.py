"""Jobs as a new user writes them in their first hour: real 4-rank gloo jobs, ``AUTOANNOT=1``,
with the settings people get wrong. Each plants one delay (rank 2 sleeps before step 3's
broadcast) whose rank, step and call site the tools must answer with.

* ``shared``: ``AUTOANNOT_RECORD`` names one file for every rank (no ``{rank}``), traces exported
  on a profiler schedule;
* ``unscheduled``: ``torch.profiler.profile(...)`` with ``prof.step()`` and no schedule (torch
  then writes no ``ProfilerStep#`` ranges), started after a few collectives, so each rank's
  profiler start-up shows as a skew at the first collectives it records;
* ``unrecorded``: traces on a schedule with no ``AUTOANNOT_RECORD``: gloo's traces alone.
"""

from __future__ import annotations

import inspect
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

WORLD, STEPS, PLANTED_STEP, PLANTED_RANK = 4, 6, 3, 2
DELAY_S = 0.2
#: Each rank's profiler start, staggered: what a profiler's own start-up does on a busy host.
PROFILER_START_S = 0.15


def _here() -> int:
    """The line after the caller's: where the planted collective is called."""
    return inspect.currentframe().f_back.f_lineno + 1  # type: ignore[union-attr]


def _step(rank: int, step: int, t: dict[str, Any], sites: dict[str, str]) -> None:
    if step == PLANTED_STEP and rank == PLANTED_RANK:
        time.sleep(DELAY_S)
    sites.setdefault("broadcast", f"{__file__}:{_here()}")
    dist.broadcast(t["weights"], src=0)
    dist.all_reduce(t["grads"])


def warm_up(t: dict[str, Any]) -> None:
    """A model's first collectives."""
    for _ in range(2):
        dist.all_reduce(t["grads"])


def train(rank: int, world: int, out: str, kind: str) -> dict[str, Any]:
    """Warm-up collectives, then profiled steps of a broadcast and an all-reduce (the
    unscheduled profiler starts after the warm-up, the scheduled one before it)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    import autoannot

    assert autoannot.is_enabled(), "AUTOANNOT=1 must reach the ranks"
    t = {"weights": torch.zeros(1 << 10), "grads": torch.ones(1 << 12)}
    sites: dict[str, str] = {}
    if kind == "unscheduled":
        warm_up(t)  # before the profiler: a model's first collectives
        time.sleep(rank * PROFILER_START_S)
        prof = profile(activities=[ProfilerActivity.CPU])
    else:
        with warnings.catch_warnings():  # ("won't be using warmup": every step is recorded)
            warnings.simplefilter("ignore")
            every_step = schedule(wait=0, warmup=0, active=STEPS, repeat=1)
        prof = profile(activities=[ProfilerActivity.CPU], schedule=every_step)
    with prof:
        if kind != "unscheduled":
            # In the profiler's first step. A profiler's start-up (hundreds of ms on a busy
            # 2-core host, some ranks more than others) is real lateness at the next
            # collective, and record files alone cannot tell it from a slow rank: here it
            # lands on each group's first collective, warm-up by the tools' rule.
            warm_up(t)
        for step in range(STEPS):
            _step(rank, step, t, sites)
            prof.step()
    prof.export_chrome_trace(f"{out}/trace_rank{rank}.json")
    return {"sites": sites}


def run(kind: str, out: Path, record: str | None = "rank{rank}.jsonl") -> list[dict[str, Any]]:
    """Run the ``kind`` job into ``out`` with ``AUTOANNOT_RECORD`` set to ``out/record``
    (unset where ``record`` is None); each rank's result."""
    from harness import run_job

    return run_job(train, WORLD, out, (str(out), kind), timeout_s=120, record=record)

if __name__ == "__main__":  # python tests/user_jobs.py KIND OUT [RECORD|-]: a job to look at
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    target = Path(sys.argv[2])
    target.mkdir(parents=True, exist_ok=True)
    record = sys.argv[3] if len(sys.argv) > 3 else "rank{rank}.jsonl"
    started = time.monotonic()
    print(json.dumps(run(sys.argv[1], target, None if record == "-" else record), indent=1))
    print(f"{time.monotonic() - started:.1f} s", file=sys.stderr)

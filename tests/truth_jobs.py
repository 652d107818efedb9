"""Truth sets for the cross-rank tools: real 4-rank gloo jobs, run as users run them
(``AUTOANNOT=1``, ``AUTOANNOT_RECORD``, torch's profiler on a schedule, ``prof.step()``), with one
delay planted at a known rank, step and call site. What the tools must answer comes from the
plant, never from the tools themselves.

* ``compute``: rank 2 computes (sleeps) 0.5 s before step 3's broadcast; rank 3 also starts late
  (warm-up: it sleeps before its first collective), which must not lead the ranking.
* ``chain``: rank 1 sleeps before step 3's all-reduce in the pair group {0, 1}; the delay then
  travels through the groups {1, 2} and {2, 3}: three collectives, one cause.
* ``hang``: rank 3 leaves the job before step 3's broadcast; the others are stuck in it until
  gloo tells them their peer is gone.
"""

from __future__ import annotations

import inspect
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

WORLD, STEPS, PLANTED_STEP = 4, 5, 3
DELAY_S = 0.5
WARMUP_S = 0.3  # rank 3's late start: before its first collective
PLANTED_RANK = {"compute": 2, "chain": 1, "hang": 3}


def _here() -> int:
    """The line after the caller's: where the planted collective is called."""
    return inspect.currentframe().f_back.f_lineno + 1  # type: ignore[union-attr]


def _step(rank: int, step: int, kind: str, groups: dict[str, Any], t: dict[str, Any],
          sites: dict[str, str]) -> None:
    planted = step == PLANTED_STEP and rank == PLANTED_RANK[kind]
    if kind == "compute" and planted:
        time.sleep(DELAY_S)
    sites.setdefault("broadcast", f"{__file__}:{_here()}")
    dist.broadcast(t["weights"], src=0)
    dist.all_gather_into_tensor(t["gathered"], t["shard"])
    if kind == "chain":
        if planted:
            time.sleep(DELAY_S)
        if rank in (0, 1):
            sites.setdefault("pair", f"{__file__}:{_here()}")
            dist.all_reduce(t["small"], group=groups["01"])
        if rank in (1, 2):
            dist.all_reduce(t["small"], group=groups["12"])
        if rank in (2, 3):
            dist.all_reduce(t["small"], group=groups["23"])
    dist.all_reduce(t["grads"])


def train(rank: int, world: int, out: str, kind: str) -> dict[str, Any]:
    """Steps of a broadcast, an all-gather and an all-reduce on the default group (and, for
    ``chain``, all-reduces on three pair groups), every step profiled. Returns the planted
    call sites and what the rank lived through."""
    from torch.profiler import ProfilerActivity, profile, schedule

    import autoannot

    assert autoannot.is_enabled(), "AUTOANNOT=1 must reach the ranks"
    groups = {"01": dist.new_group([0, 1]), "12": dist.new_group([1, 2]),
              "23": dist.new_group([2, 3])}
    t = {"weights": torch.zeros(1 << 10), "grads": torch.ones(1 << 14),
         "shard": torch.ones(1 << 8), "gathered": torch.zeros(world << 8),
         "small": torch.ones(64)}
    sites: dict[str, str] = {}
    stuck = arrived = None
    with warnings.catch_warnings():  # ("won't be using warmup": every step is recorded)
        warnings.simplefilter("ignore")
        every_step = schedule(wait=0, warmup=0, active=STEPS, repeat=1)  # ProfilerStep#0, ...
    with profile(activities=[ProfilerActivity.CPU], schedule=every_step,
                 on_trace_ready=None if kind == "hang" else
                 lambda p: p.export_chrome_trace(f"{out}/trace_rank{rank}.json")) as prof:
        for step in range(STEPS):
            if step == 0 and rank == 3:
                time.sleep(WARMUP_S)  # a late start: warm-up's skew, not a straggler's
            if step == 0:  # when this rank came to its first collective (one host: one clock)
                arrived = time.time()
            if kind == "hang" and step == PLANTED_STEP and rank == 3:
                break  # this rank is gone: it never enters step 3's broadcast
            try:
                _step(rank, step, kind, groups, t, sites)
            except RuntimeError as exc:  # a peer left: gloo says so
                stuck = f"step {step}: {str(exc).splitlines()[0][:120]}"
                break
            prof.step()
    return {"sites": sites, "stuck": stuck, "arrived": arrived}


def run(kind: str, out: Path) -> list[dict[str, Any]]:
    """Run the ``kind`` job into ``out`` (traces, record files and rows as the job writes
    them); each rank's result."""
    from harness import run_job

    return run_job(train, WORLD, out, (str(out), kind), timeout_s=30 if kind == "hang" else 300)


if __name__ == "__main__":  # python tests/truth_jobs.py KIND OUT: a job to look at by hand
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    target = Path(sys.argv[2])
    target.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(json.dumps(run(sys.argv[1], target), indent=1))
    print(f"{time.monotonic() - started:.1f} s", file=sys.stderr)

"""Hang truth sets: real 4-rank gloo jobs, run as users run them (``AUTOANNOT=1``,
``AUTOANNOT_RECORD``), each hung at a known rank, step and collective. What the tools must
answer comes from the plant, never from the tools.

* ``mesh``: a 2 x 2 mesh — tensor-parallel groups {0, 1} {2, 3}, data-parallel groups {0, 2}
  {1, 3}; each step a tp all-reduce, a dp all-reduce and a default-group broadcast. Rank 3
  stops after step 5's tp all-reduce: rank 1 is then blocked in dp {1, 3}'s all-reduce #5,
  ranks 0 and 2 in the broadcast or in tp #6 — all on rank 3.
* ``sleep``: the mesh, but rank 3 stays alive, asleep outside any collective (``SLEEP_S``)
  after step 5's tp all-reduce: the same answer while it sleeps (read from the files the
  job is still writing), then the job finishes. With torch's Flight Recorder on, each rank
  dumps its ring when asked (a ``DUMP_REQUEST`` file appears: as every rank of an NCCL job
  dumps when one times out), the sleeper too.
* ``frozen``: the mesh, but rank 3 stops its own process (``SIGSTOP``, its pid in
  ``FROZEN_PID``) after step 5's tp all-reduce, as a stuck host does: its connections stay
  open, and the others wait (gloo would fail them at once were its process gone) until it is
  continued (``SIGCONT``); then the job finishes.
* ``late``: the mesh, ``LONG_STEPS`` steps, where rank 2 sleeps ``LATE_S`` before each step's
  broadcast: a straggler.
* ``late_tp``: the mesh, where rank 2 sleeps ``LATE_S`` before its tp all-reduce {2, 3} in each
  of the first ``late_steps`` steps (all of them by default): a straggler of a two-rank group,
  as long as the plant lasts.
* ``blip``: the mesh, where rank 1 sleeps ``LATE_S`` before its tp all-reduce {0, 1} in
  ``BLIP_STEPS`` steps in a row (a fast job's 20 collectives: a blip, no straggler).
* ``steady``: the mesh, ``LONG_STEPS`` steps of ``STEADY_STEP_S`` of "compute" each, nothing
  planted: no straggler.

``steps`` sets the number of steps of the long kinds (``late``, ``late_tp``, ``blip``,
``steady``); ``described=False`` makes the tp and dp groups without a description (torch
records them as ``undefined``).
* ``clean``: the mesh with nothing planted (each step after ``CLEAN_STEP_S`` of "compute", for
  a watcher to look at it running).
* ``mismatch``: rank 1 calls an all-gather where the others call an all-reduce, at step 2 of
  the default group: a mismatch, not an absence.
* ``two``: pairs {0, 1} and {2, 3} only; rank 1 stops before step 3's pair all-reduce, rank 3
  before step 4's: two culprits, each holding up its own pair.
"""

from __future__ import annotations

import inspect
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

WORLD, STEPS, STOP_STEP, SLEEP_S = 4, 8, 5, 20.0
MISMATCH_STEP, MISMATCH_RANK = 2, 1
TWO_STOPS = {1: 3, 3: 4}  # rank -> the step it stops before
FR_PREFIX = "nccl_trace_rank_"  # (torch's own dump files' names: TORCH_FR_DUMP_TEMP_FILE's)
DUMP_REQUEST = "dump-now"
FROZEN_PID = "frozen.pid"
CLEAN_STEP_S = 0.1
LONG_STEPS, LATE_RANK, LATE_S, STEADY_STEP_S = 200, 2, 0.02, 0.005
LONG_KINDS = ("late", "late_tp", "blip", "steady")
BLIP_RANK, BLIP_FROM, BLIP_STEPS = 1, 40, 20


def _here() -> int:
    return inspect.currentframe().f_back.f_lineno + 1  # type: ignore[union-attr]


def _group(ranks: list[int], desc: str | None) -> Any:
    if desc and "group_desc" in inspect.signature(dist.new_group).parameters:
        return dist.new_group(ranks, group_desc=desc)
    return dist.new_group(ranks)


def train(rank: int, world: int, out: str, kind: str, steps: int | None = None,
          late_steps: int | None = None, described: bool = True) -> dict[str, Any]:
    """The job ``kind``; returns the call sites of its collectives and where it stopped."""
    import autoannot

    assert autoannot.is_enabled(), "AUTOANNOT=1 must reach the ranks"
    tp = [_group([0, 1], "tp" if described else None), _group([2, 3], "tp" if described else None)]
    dp = [_group([0, 2], "dp" if described else None), _group([1, 3], "dp" if described else None)]
    mine_tp, mine_dp = tp[rank // 2], dp[rank % 2]
    if kind == "sleep" and os.environ.get("TORCH_FR_BUFFER_SIZE"):
        _dump_when_asked(out, rank)
    x = torch.ones(64)
    sites: dict[str, str] = {}
    stuck = None
    steps = steps or (LONG_STEPS if kind in LONG_KINDS else STEPS)
    late_steps = steps if late_steps is None else late_steps
    for step in range(steps):
        try:
            if kind == "two":
                if TWO_STOPS.get(rank) == step:
                    break
                sites.setdefault("pair", f"{__file__}:{_here()}")
                dist.all_reduce(x, group=mine_tp)
                continue
            if kind in ("clean", "steady"):  # (a step's compute)
                time.sleep(CLEAN_STEP_S if kind == "clean" else STEADY_STEP_S)
            if ((kind == "late_tp" and rank == LATE_RANK and step < late_steps)
                    or (kind == "blip" and rank == BLIP_RANK
                        and BLIP_FROM <= step < BLIP_FROM + BLIP_STEPS)):
                time.sleep(LATE_S)
            sites.setdefault("tp", f"{__file__}:{_here()}")
            dist.all_reduce(x, group=mine_tp)
            if rank == 3 and step == STOP_STEP and kind in ("mesh", "sleep", "frozen"):
                if kind == "mesh":
                    break  # this rank is gone
                if kind == "frozen":
                    import signal

                    Path(out, FROZEN_PID).write_text(str(os.getpid()))
                    os.kill(os.getpid(), signal.SIGSTOP)  # until continued
                else:
                    time.sleep(SLEEP_S)  # alive, outside any collective
            sites.setdefault("dp", f"{__file__}:{_here()}")
            dist.all_reduce(x, group=mine_dp)
            if kind == "mismatch" and step == MISMATCH_STEP:
                if rank == MISMATCH_RANK:
                    sites.setdefault("odd", f"{__file__}:{_here()}")
                    dist.all_gather_into_tensor(torch.zeros(world * 64), x)
                else:
                    sites.setdefault("even", f"{__file__}:{_here()}")
                    dist.all_reduce(x)
                continue
            if kind == "late" and rank == LATE_RANK:
                time.sleep(LATE_S)
            sites.setdefault("broadcast", f"{__file__}:{_here()}")
            dist.broadcast(x, src=0)
        except RuntimeError as exc:  # a peer left, or timed out: gloo says so
            stuck = f"step {step}: {str(exc).splitlines()[0][:120]}"
            break
    if os.environ.get("TORCH_FR_BUFFER_SIZE") and kind != "sleep":  # torch's Flight
        _dump(out, rank)  # Recorder on: dump it, as a rank does after its timeout
    return {"sites": sites, "stuck": stuck, "values": x.tolist()}


def _dump(out: str, rank: int) -> None:
    """This rank's Flight Recorder ring, in torch's pickle, written whole (then renamed)."""
    dump = torch._C._distributed_c10d._dump_fr_trace()
    part = Path(out, f".{FR_PREFIX}{rank}.part")
    part.write_bytes(dump)
    part.rename(Path(out, f"{FR_PREFIX}{rank}"))


def _dump_when_asked(out: str, rank: int) -> None:
    """A thread that dumps this rank's ring once ``DUMP_REQUEST`` appears in ``out`` (the
    rank's main thread may be blocked in a collective, or asleep)."""
    import threading

    def wait() -> None:
        while not Path(out, DUMP_REQUEST).exists():
            time.sleep(0.05)
        _dump(out, rank)

    threading.Thread(target=wait, daemon=True, name="fr-dump").start()


def dump_both(rank: int, world: int, out: str) -> str:
    """A few collectives on a gloo group with torch's Flight Recorder on, dumped both ways
    (``_dump_fr_trace``: pickle; ``_dump_fr_trace_json``: JSON); the call site."""
    x = torch.ones(16)
    for _ in range(3):
        site = f"{__file__}:{_here()}"
        dist.all_reduce(x)
    c10d = torch._C._distributed_c10d
    Path(out, f"{FR_PREFIX}{rank}").write_bytes(c10d._dump_fr_trace())
    json_dump = c10d._dump_fr_trace_json()
    Path(out, f"json_{FR_PREFIX}{rank}.json").write_bytes(
        json_dump if isinstance(json_dump, bytes) else str(json_dump).encode())
    return site


def run(kind: str, out: Path, timeout_s: float = 20, record: str | None = "rank{rank}.jsonl",
        steps: int | None = None, late_steps: int | None = None, described: bool = True
        ) -> list[dict[str, Any]]:
    """Run the ``kind`` job into ``out`` (each rank's record file, unless ``record`` is None);
    each rank's result."""
    from harness import run_job

    return run_job(train, WORLD, out, (str(out), kind, steps, late_steps, described),
                   timeout_s=timeout_s, record=record)


if __name__ == "__main__":  # python tests/hang_jobs.py KIND OUT: a job to look at by hand
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    target = Path(sys.argv[2])
    target.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(json.dumps(run(sys.argv[1], target, float(sys.argv[3]) if len(sys.argv) > 3
                         else 20), indent=1))
    print(f"{time.monotonic() - started:.1f} s", file=sys.stderr)

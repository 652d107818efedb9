"""The GPU's times on real GPU data: what ``tests/gpu/gpu_times.py`` left on one H100 (torch
2.11, NCCL 2.28.9), read back on the CPU. Each archive under tests/data/gpu/times/ holds one
run's rings and logs:

- ``eager``: two processes sharing the GPU over gloo with CUDA tensors, rank 1's stream held by
  ``torch.cuda._sleep`` before each of 90 all-reduces, its host on time; the plant as its GPU
  ran it (``plant_ms``, from timing events around the sleep) and the all-reduce's line
  (``rank1.line``): the truth the answers are held to (run d: again as ``eager_stamps``, timed
  by stamps: ``AUTOANNOT_GPU_EAGER_STAMPS=1``; run e: ``eager_stamps`` and ``eager_driver``,
  by the driver's events: ``AUTOANNOT_GPU_DRIVER_EVENTS=1``);
- ``graph``: a 1-rank NCCL graph of 8 all-reduces, 20 ms of sleep before the 5th, replayed
  10 times one at a time, 10 times back to back, then once held 8 s before its 5th (runs a
  and b stamped each collective before and after, as ``AUTOANNOT_GPU_GRAPH_ENDS=1`` does now;
  run c before alone, the default; run e by the ``tagged`` stamp kernel, the default since).

Run b is the one where rank 0 was once last by 29.75 ms (the shared GPU's time-slicing): a
single instance that ``skew`` and the watch took for the job's noise, and so named no one.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from autoannot.traces.read import ring_files

DATA = Path(__file__).parent / "data" / "gpu" / "times"
RUNS = sorted(p.name for p in DATA.glob("h100_run_*.tgz"))


def _eager_runs() -> list[tuple[str, str]]:
    """(archive, folder) of each eager run: ``eager`` (events), ``eager_stamps`` (run d on),
    ``eager_driver`` (run e)."""
    found = []
    for name in RUNS:
        with tarfile.open(DATA / name) as archive:
            folders = {member.name.split("/")[1] for member in archive.getmembers()
                       if member.name.count("/") >= 2}
        found += [(name, folder) for folder in ("eager", "eager_stamps", "eager_driver")
                  if folder in folders]
    return found


def _extracted(name: str, into: Path) -> Path:
    with tarfile.open(DATA / name) as archive:
        archive.extractall(into, filter="data")
    return into / "times"


@pytest.fixture(params=RUNS)
def run(request, tmp_path: Path) -> Path:
    return _extracted(request.param, tmp_path)


@pytest.fixture(params=_eager_runs(), ids="-".join)
def eager(request, tmp_path: Path) -> Path:
    name, folder = request.param
    return _extracted(name, tmp_path) / folder


def _skew(rings: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "autoannot", "skew", "-q", "--json", str(rings)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _late_ms(found: dict, rank: int) -> list[float]:
    return [i["skew_us"] / 1e3 for i in found["instances"]
            if i["straggler"] == rank and not i["warmup"]]


def test_skew_names_the_late_gpu_by_its_plant_where_host_times_name_no_one(eager: Path,
                                                                          tmp_path: Path) -> None:
    plant = float((eager / "plant_ms").read_text())
    line = int((eager / "rank1.line").read_text())
    found = _skew(eager / "rings")
    assert found["lead"][0].startswith("rank 1 held the others up most"), found["lead"]
    assert found["lead"][0].endswith(f"gpu_times.py:{line}"), found["lead"]
    late = _late_ms(found, 1)
    assert len(late) >= 81, len(late)  # (90 all-reduces, 9 in 10 at least)
    assert abs(statistics.median(late) - plant) <= 0.2 * plant, (statistics.median(late), plant)
    host_only = tmp_path / "host_only"
    host_only.mkdir()
    for path in (eager / "rings").iterdir():
        if not path.name.endswith(".ring.gpu"):
            shutil.copy(path, host_only)
    host = _skew(host_only)
    assert not host["lead"][0].startswith("rank 1 held"), host["lead"]
    host_late = _late_ms(host, 1)
    assert not host_late or statistics.median(host_late) < 0.1 * plant, host_late


def test_the_watch_names_the_late_gpu_from_its_times(eager: Path) -> None:
    from autoannot.live import watch
    from autoannot.traces.analysis import stragglers

    plant = float((eager / "plant_ms").read_text())
    tails = watch.tails_of_rings(eager / "rings")
    assert tails.gpu == {"0"}, tails.gpu
    named, _ = stragglers.Tracker().update(tails.entered, tails.members, tails.gaps,
                                           tails.clocks, tails.sites, tails.labels, tails.gpu)
    assert [s.rank for s in named] == [1], named
    said = named[0].line()
    assert said.startswith("STRAGGLER: rank 1's GPU started last at ") and (
        "from the GPU's times" in said), said
    assert abs(named[0].late_by_us / 1e3 - plant) <= 0.2 * plant, (named[0].late_by_us, plant)


def test_each_replays_collectives_have_their_own_gpu_times(run: Path) -> None:
    """Every launch of the 20 replays has its GPU start (and end, where stamped); each
    replay's 5th starts 20 ms (the plant, ±20%) after its 4th, one at a time and back to back;
    the held replay's 5th started 8 s (±20%) after its 4th; each start is after its replay was
    called."""
    one = ring_files.read(run / "graph" / "rings" / "rank0.ring")
    assert one.gpu is not None
    graph_kinds = {k for k, kind in one.kinds.items() if kind.get("graph")}
    mine = np.array([i for i in range(len(one.records))
                     if int(one.records["kind"][i]) in graph_kinds])
    assert len(mine) == 8 * 21  # (20 replays, then the held graph's one; the warm-ups before
    replays = mine[:8 * 20].reshape(20, 8)  # each capture are eager launches)
    starts = np.asarray(one.gpu["start_ns"])[replays]
    ends = np.asarray(one.gpu["end_ns"])[replays]
    entered = np.asarray(one.records["entered_ns"])[replays]
    assert (starts > 0).all(), starts  # (ends: all, where the run stamped them, or none)
    assert (ends >= starts).all() or (ends == 0).all(), (starts, ends)
    assert (starts >= entered).all()
    fifth = (starts[:, 4] - starts[:, 3]) / 1e6
    assert (np.abs(fifth - 20.0) <= 4.0).all(), fifth
    held = mine[-8:]
    held_starts = np.asarray(one.gpu["start_ns"])[held]
    assert abs((held_starts[4] - held_starts[3]) / 1e9 - 8.0) <= 1.6, held_starts
    said = (run / "graph" / "rank0.log").read_text()
    assert "its GPU has not started collective 5 of the 8 of graph" in said

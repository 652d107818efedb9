"""The GPU's times of each collective (``keep/gpu_clock.py``) on planted GPU timelines
(``planted_gpu.PlantedGpu``: a known delay on a rank's stream, a GPU clock 123 s off the
host's), through the real route, ring, reader, watch and ``skew`` of real gloo jobs; and the
real CUDA runs' files (tests/gpu/gpu_times.py, committed under tests/data/gpu/times/) where
they are."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from harness import run_ranks
from planted_gpu import PlantedGpu

from autoannot import cli
from autoannot.base import ring_format
from autoannot.keep.gpu_clock import GpuClock
from autoannot.traces.read import ring_files

PLANT_MS = 20.0
STEPS, STEP_S = 80, 0.04


def _clock(tmp_path: Path, gpu: PlantedGpu, capacity: int = 64) -> GpuClock:
    return GpuClock(str(tmp_path / f"rank0{ring_format.GPU_SUFFIX}"), capacity, gpu,
                    thread=False)


def _times(clock: GpuClock, count: int) -> Any:
    clock._map.flush()
    times, state = ring_files.gpu_times(Path(clock.path), count, count)
    return times, state


@pytest.mark.parametrize("eager_stamps", [False, True])
def test_a_launchs_gpu_start_and_end_are_the_gpus_on_the_hosts_clock(tmp_path: Path,
                                                                     eager_stamps: bool) -> None:
    """A launch on an idle stream starts as it is called; one behind a 30 ms hold starts 30 ms
    later, and until then it is the launch the GPU waits before, since its entry; a call that
    returned a Work has no end. Times on the host's monotonic clock, the GPU's 123 s off. By
    events or by stamps on a branch (``AUTOANNOT_GPU_EAGER_STAMPS``) alike."""
    gpu = PlantedGpu()
    clock = _clock(tmp_path, gpu)
    clock.eager_stamps = eager_stamps
    before = time.monotonic_ns()
    clock.ended(clock.started(0), True)
    gpu.sleep(30)
    called = time.monotonic_ns()
    clock.ended(clock.started(1), True)
    clock.ended(clock.started(2), False)
    clock.look()
    times, state = _times(clock, 3)
    assert times["start_ns"][0] >= before and times["start_ns"][0] - before < 5e6, times
    assert times["end_ns"][0] >= times["start_ns"][0]
    assert list(times["start_ns"][1:]) == [0, 0], times  # (held: not started yet)
    assert state.waiting == 1 and called <= state.waiting_entered_ns < called + 5e6, state
    time.sleep(0.04)
    clock.look()
    times, state = _times(clock, 3)
    late = (times["start_ns"][1] - called) / 1e6
    assert abs(late - 30) < 3, late
    assert times["end_ns"][2] == 0 and times["start_ns"][2] >= times["start_ns"][1], times
    assert state.waiting is None and state.error_ns >= 0
    clock.close()


def test_where_eager_stamps_cannot_be_made_the_launches_are_timed_by_events(
        tmp_path: Path, recwarn) -> None:
    """Stamps the driver refuses (no JIT for its PTX, say): said once, and the launch and those
    after it are timed by events, not left untimed."""
    gpu = PlantedGpu()

    def refused(stream: Any = None) -> Any:
        raise RuntimeError("cuModuleLoadData failed: CUresult 218")

    gpu.eager_stamp = refused
    clock = _clock(tmp_path, gpu)
    clock.eager_stamps = True
    for index in range(3):
        clock.ended(clock.started(index), True)
    clock.look()
    times, _ = _times(clock, 3)
    assert (times["start_ns"] > 0).all() and (times["end_ns"] >= times["start_ns"]).all()
    said = [str(w.message) for w in recwarn if "eager stamps failed" in str(w.message)]
    assert len(said) == 1 and "timed by events instead" in said[0], said
    clock.close()


def _captured(clock: GpuClock, gpu: PlantedGpu, graph: str, collectives: int = 8) -> list[Any]:
    clock.graph_ends = True  # (AUTOANNOT_GPU_GRAPH_ENDS=1: a stamp before and after each)
    gpu.capture = []
    for _ in range(collectives):
        clock.ended(clock.started(-1), True)
    captured, gpu.capture = gpu.capture, None
    clock.capture_ended(graph)
    return captured


def test_each_collective_of_a_replay_is_timed_and_a_planted_fifth_is_late(tmp_path: Path
                                                                           ) -> None:
    """A graph of 8 collectives, 20 ms held before the 5th: each replay's 5th starts 20 ms after
    its 4th, replays one at a time and back to back (the host ahead of the GPU: each replay's
    stamps are its own run's; with events, captured once for all replays, a replay launched
    before the last was read took its times away: 16 of 3,200 launches timed on the device)."""
    gpu = PlantedGpu()
    clock = _clock(tmp_path, gpu)
    captured = _captured(clock, gpu, "g")
    assert len(captured) == 16  # (a stamp before and after each)
    index = 0
    for _ in range(3):  # (one at a time)
        entered = time.monotonic_ns()
        gpu.replay(captured, {8: PLANT_MS})
        clock.replayed("g", index, 8, entered)
        index += 8
        time.sleep(0.03)
        clock.look()
    calls = []
    for _ in range(3):  # (back to back: called before the GPU ran the one before)
        calls.append(time.monotonic_ns())
        gpu.replay(captured, {8: PLANT_MS})
        clock.replayed("g", index + 8 * len(calls) - 8, 8, calls[-1])
    time.sleep(0.08)
    clock.look()
    times, state = _times(clock, index + 24)
    starts = times["start_ns"].reshape(6, 8)
    assert (starts > 0).all() and (times["end_ns"] >= times["start_ns"]).all(), times
    fifth = (starts[:, 4] - starts[:, 3]) / 1e6
    assert ((fifth > PLANT_MS - 2) & (fifth < PLANT_MS + 2)).all(), fifth
    apart = (starts[3:, 0][1:] - starts[3:, 0][:-1]) / 1e6  # (each its own run's: a replay
    assert (apart >= PLANT_MS).all(), apart  # after the one before, held 20 ms in it)
    assert state.waiting is None
    clock.close()


def test_replays_are_timed_once_an_anchor_held_in_the_gpus_queue_lands(tmp_path: Path,
                                                                        recwarn) -> None:
    """The anchor stamp held 300 ms behind the job's work (a stream of the clock's that shares
    a hardware queue with the job's; before, the clock waited 0.1 s for it, then left the
    graphs untimed for the 10 s till its next try): the replays' times are read once it lands,
    at the plant's place on the GPU, the anchor's error no more than the looks' spacing, and
    nothing said (it landed well within 5 s)."""
    gpu = PlantedGpu()
    gpu.anchor_held_ms = 300.0
    clock = _clock(tmp_path, gpu)
    captured = _captured(clock, gpu, "g")
    calls = []
    for replay in range(4):
        calls.append(time.monotonic_ns())
        gpu.replay(captured, {8: PLANT_MS})
        clock.replayed("g", 8 * replay, 8, calls[-1])
    looks, spacing, last = 0, 0, time.monotonic_ns()
    while _times(clock, 32)[0]["start_ns"][-1] == 0 and looks < 200:  # (2 s at most)
        clock.look()
        looks += 1
        spacing, last = max(spacing, time.monotonic_ns() - last), time.monotonic_ns()
        time.sleep(0.01)
    times, state = _times(clock, 32)
    assert (times["start_ns"] > 0).all(), times  # (the 10 s retry: none timed here)
    assert looks < 100 and (time.monotonic_ns() - calls[0]) / 1e6 >= 300, looks
    # (it landed 300 ms on, and the replays were read within a second, not 10 s later)
    starts = times["start_ns"].reshape(4, 8)
    fifth = (starts[:, 4] - starts[:, 3]) / 1e6
    assert ((fifth > PLANT_MS - 2) & (fifth < PLANT_MS + 2)).all(), fifth
    assert 0 < state.error_ns <= spacing + 2e6 < 100e6, (state, spacing)  # (a look's
    # spacing, not the 300 ms held)
    assert abs(starts[0, 0] - calls[0]) < state.error_ns + 2e6, (starts[0, 0], calls[0])
    assert not [w for w in recwarn if "anchor stamp" in str(w.message)]
    clock.close()


def test_an_anchor_stamp_read_as_lost_is_launched_again(tmp_path: Path) -> None:
    """An anchor whose slot reads as written over is never waited for: the next look
    launches another, and the replay is timed from it."""
    gpu = PlantedGpu()
    gpu.anchors_lost = 1
    clock = _clock(tmp_path, gpu)
    captured = _captured(clock, gpu, "g")
    entered = time.monotonic_ns()
    gpu.replay(captured, {})
    clock.replayed("g", 0, 8, entered)
    clock.look()
    assert (_times(clock, 8)[0]["start_ns"] == 0).all()  # (no anchor yet)
    clock.look()
    times, _ = _times(clock, 8)
    assert (times["start_ns"] >= entered).all() and gpu.anchors_lost == 0, times
    clock.close()


def test_a_replay_held_before_its_fifth_is_waiting_there_and_one_read_too_late_is_unknown(
        tmp_path: Path) -> None:
    """A replay held 10 s before its 5th: the clock says it waits at the 5th's launch, since
    the replay was called. A replay whose stamps were written over before the clock read them
    (more than a point's runs later) is unknown (0), never a later replay's time."""
    gpu = PlantedGpu()
    gpu.depth = 4
    clock = _clock(tmp_path, gpu)
    captured = _captured(clock, gpu, "g")
    entered = time.monotonic_ns()
    gpu.replay(captured, {})
    clock.replayed("g", 0, 8, entered)
    for replay in range(1, 6):  # (five more before the clock looks: the first's written over)
        gpu.replay(captured, {})
        clock.replayed("g", 8 * replay, 8, time.monotonic_ns())
    time.sleep(0.01)
    clock.look()
    times, state = _times(clock, 48)
    assert (times["start_ns"][:8] == 0).all() and (times["start_ns"][16:] > 0).all(), times
    entered = time.monotonic_ns()
    clock.replayed("g", 48, 8, entered)  # (called; its GPU has not reached it yet)
    clock.look()
    _, state = _times(clock, 56)
    assert state.waiting == 48 and state.waiting_entered_ns == entered, state
    gpu.replay(captured, {8: 10_000})
    time.sleep(0.01)
    clock.look()
    times, state = _times(clock, 56)
    assert state.waiting == 52 and state.waiting_entered_ns == entered, state
    assert (times["start_ns"][48:52] >= entered).all() and (times["start_ns"][52:] == 0).all()
    clock.close()


def test_a_graphs_collectives_are_stamped_before_alone_unless_their_ends_are_asked(
        tmp_path: Path) -> None:
    """By default a captured collective gets one stamp, before it: its GPU start (an end's
    stamp costs a replay of small kernels some 3% on an H100)."""
    gpu = PlantedGpu()
    clock = _clock(tmp_path, gpu)
    assert clock.graph_ends is False
    gpu.capture = []
    for _ in range(8):
        clock.ended(clock.started(-1), True)
    captured, gpu.capture = gpu.capture, None
    clock.capture_ended("g")
    assert len(captured) == 8
    entered = time.monotonic_ns()
    gpu.replay(captured, {4: PLANT_MS})
    clock.replayed("g", 0, 8, entered)
    time.sleep(0.03)
    clock.look()
    times, state = _times(clock, 8)
    assert (times["start_ns"] >= entered).all() and (times["end_ns"] == 0).all(), times
    assert abs((times["start_ns"][4] - times["start_ns"][3]) / 1e6 - PLANT_MS) < 2
    assert state.waiting is None
    clock.close()


def test_a_graph_whose_ledger_differs_from_its_events_is_not_timed(tmp_path: Path) -> None:
    gpu = PlantedGpu()
    clock = _clock(tmp_path, gpu)
    _captured(clock, gpu, "g", 3)
    with pytest.warns(RuntimeWarning, match="graph g: ValueError: 3 timed launches captured, "
                      "4 in its ledger; the launches run on, without their GPU times"):
        clock.replayed("g", 0, 4, time.monotonic_ns())
    assert not clock._pending
    clock.close()


# a real gloo job on a planted GPU --------------------------------------------------------


def planted_job(rank: int, world: int, out: str, hold_at: int | None, steps: int,
                below: bool = False, eager_stamps: bool = False) -> Any:
    """``steps`` all-reduces, ``STEP_S`` apart, through the agent with a ring that times them
    on a planted GPU; rank 1's stream held ``PLANT_MS`` before each (its host on time), or
    (``hold_at``) 60 s before that one only, then rank 0 watches for 3 s as the live watch
    does for 6 s. ``below``: through the process group (``pg.allreduce``: below the Python API,
    seen by torch's group hooks). ``eager_stamps``: timed by stamps, not events
    (``AUTOANNOT_GPU_EAGER_STAMPS``). Returns the all-reduce's line and what the watch said."""
    import inspect

    import agent_hooks as hooks

    import autoannot
    from autoannot.keep import gpu_clock
    from autoannot.keep.ring import Ring
    from autoannot.live import watch

    gpu_clock.EAGER_STAMPS = eager_stamps

    autoannot.enable()
    gpu = PlantedGpu()
    ring = Ring(f"{out}/rings")
    ring.gpu_source = gpu
    hooks.AGENT.state.open_journal(ring)
    warm = dist.new_group(backend="gloo")  # (the ranks in step: their start-up is no
    gpu.times_all = False  # lateness, and in a group of its own no noise of the default's)
    dist.barrier(group=warm)
    gpu.times_all = True
    payload = torch.zeros(1, dtype=torch.int64)
    line = 0
    for step in range(steps):
        time.sleep(STEP_S)
        if rank == 1 and hold_at is None:
            gpu.sleep(PLANT_MS)
        if rank == 1 and step == hold_at:
            gpu.sleep(60_000)
        payload[0] = gpu.called()
        gpu.payload = payload
        if below:
            gpu.ends = False
            options = dist.AllreduceOptions()
            options.reduceOp = dist.ReduceOp.MAX
            line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
            dist.group.WORLD.allreduce([payload], options).wait()
            continue
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        dist.all_reduce(payload, op=dist.ReduceOp.MAX)
    said: list[str] = []
    if hold_at is not None:  # (the hosts stop launching: as a rank blocked on its GPU)
        watcher = watch.Watcher(Path(f"{out}/rings"), 1.0, said.append)
        for _ in range(24):
            watcher.look()
            time.sleep(0.25)
        dist.barrier(group=dist.new_group(backend="gloo"))
    hooks.AGENT.state.close_journal(ring)
    ring.close()
    autoannot.disable()
    return {"line": line, "said": said}


@pytest.fixture(scope="module", params=["events", "eager stamps"])
def late_gpu_run(request, tmp_path_factory) -> tuple[Path, list[Any]]:
    out = tmp_path_factory.mktemp("late_gpu")
    results = run_ranks(planted_job, 2, "gloo", (str(out), None, STEPS, False,
                                                 request.param == "eager stamps"))
    return out, results


def test_a_late_gpu_is_in_the_ring_and_skew_names_it_where_hosts_name_no_one(
        capsys, late_gpu_run, tmp_path: Path) -> None:
    """Rank 1's GPU 20 ms late before each all-reduce, its host on time: every all-reduce has
    its GPU start and end in the ring; ``skew`` leads with rank 1 by the plant (±20%) at the
    all-reduce's line; the same rings without their GPU times do not."""
    out, results = late_gpu_run
    rings = out / "rings"
    for path in ring_files.in_folder(rings):
        one = ring_files.read(path)
        assert one.gpu is not None and (one.gpu["start_ns"] > 0).sum() == STEPS, path
    assert cli.main(["skew", "-q", "--json", str(rings)]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["lead"][0].startswith("rank 1 held the others up most"), found["lead"]
    assert f":{results[1]['line']}" in found["lead"][0], found["lead"]
    late_ms = _late_of(found, 1)
    assert len(late_ms) >= 0.9 * STEPS, late_ms  # (last at every all-reduce but warm-up's)
    assert abs(statistics.median(late_ms) - PLANT_MS) <= 0.2 * PLANT_MS, late_ms
    transfer_ms = [i["transfer_us"] / 1e3 for i in found["instances"] if not i["warmup"]]
    assert statistics.median(transfer_ms) < 1.0, transfer_ms  # (GPU end less the last GPU
    host_only = tmp_path / "host_only"  # start: the planted collective takes no time; its
    # wait for rank 1 is no transfer)
    host_only.mkdir()
    for path in rings.iterdir():
        if not path.name.endswith(ring_format.GPU_SUFFIX):
            shutil.copy(path, host_only)
    assert cli.main(["skew", "-q", "--json", str(host_only)]) == 0
    late_ms = _late_of(json.loads(capsys.readouterr().out), 1)  # (its host on time: a host's
    assert len(late_ms) < 0.9 * STEPS or statistics.median(late_ms) < 0.5 * PLANT_MS  # jitter)


def _late_of(found: dict[str, Any], rank: int) -> list[float]:
    """How late ``rank`` arrived (ms) at each instance it was last at, warm-up left out, as
    ``skew --json`` says."""
    return [i["skew_us"] / 1e3 for i in found["instances"]
            if i["straggler"] == rank and not i["warmup"]]


def test_the_metrics_count_the_gpus_time_in_collectives_where_the_host_counts_none(
        late_gpu_run) -> None:
    """Rank 1's GPU 20 ms late before each all-reduce: rank 0's GPU waits for it in every
    one, so its GPU seconds in the all-reduces' group come to about steps x the plant, rank
    1's to little, and the hosts' (on time) to little; a second read adds nothing; the
    Prometheus counter and the published totals say the same."""
    pytest.importorskip("prometheus_client")
    from autoannot.live.metrics import JobMetrics
    from autoannot.live.tally import Tally

    out, _ = late_gpu_run
    rings = out / "rings"
    gpu: dict[int, float] = {}
    host: dict[int, float] = {}
    documents = []  # (what each rank publishes through a store)
    for path in ring_files.in_folder(rings):
        tally = Tally()
        tally.update(path)
        group = max(tally.gpu_seconds, key=tally.gpu_seconds.get, default=None)
        rank = int(tally.rank)
        gpu[rank] = tally.gpu_seconds.get(group, 0.0) if group else 0.0
        host[rank] = tally.seconds.get(group, 0.0) if group else 0.0
        tally.update(path)
        assert not tally.gpu_added  # (each launch counted once)
        assert tally.totals()[group]["gpu_seconds"] == round(gpu[rank], 6)
        documents.append({"rank": rank, "totals": tally.totals()})
    planted = STEPS * PLANT_MS / 1e3
    assert abs(gpu[0] - planted) <= 0.2 * planted, (gpu, planted)
    assert gpu[1] < 0.2 * planted and host[0] < 0.3 * planted, (gpu, host)
    for read in ("rings", "store"):
        metrics = JobMetrics()
        if read == "rings":
            metrics.update(rings)
        else:
            metrics.update_published(documents)
        counted = {int(s.labels["rank"]): s.value for m in metrics.registry.collect()
                   if m.name == "autoannot_collective_gpu_seconds" for s in m.samples
                   if s.name.endswith("_total")}
        assert abs(counted[0] - gpu[0]) < 1e-5 and counted[1] < 0.2 * planted, (read, counted)


def test_the_watch_names_the_late_gpu_from_the_gpus_times(late_gpu_run) -> None:
    """The straggler windows of the live watch on the same rings: rank 1's GPU named, late by
    the plant (±20%), the line saying it is read from the GPU's times."""
    from autoannot.live import watch
    from autoannot.traces.analysis import stragglers

    out, _ = late_gpu_run
    tails = watch.tails_of_rings(out / "rings")
    assert tails.gpu == {"0"}, tails.gpu
    named, _ = stragglers.Tracker().update(tails.entered, tails.members, tails.gaps,
                                           tails.clocks, tails.sites, tails.labels, tails.gpu)
    windows = [(w.first, w.span_us, w.last_of.tolist(), w.waited.round().tolist())
               for w in stragglers.windows(tails.entered, tails.members, {}, gaps=tails.gaps,
                                           clocks=tails.clocks)]
    assert [s.rank for s in named] == [1], windows
    line = named[0].line()
    assert line.startswith("STRAGGLER: rank 1's GPU started last at "), line
    assert line.endswith(tails.sites[("0", 1)]) and "from the GPU's times" in line, line
    assert abs(named[0].late_by_us - PLANT_MS * 1e3) <= 0.2 * PLANT_MS * 1e3, named


def test_a_gpu_that_never_starts_a_collective_is_named_live_at_it(capsys, tmp_path: Path
                                                                   ) -> None:
    """Rank 1's GPU held 60 s before the 30th all-reduce; both hosts entered it and stopped.
    Rank 0's watch names rank 1 at that all-reduce (#29 of the default group) and its line,
    with rank 0's GPU started and waiting in it, from the GPU's times; said once. ``check``
    on the rings the job left says the same, as of the GPU clocks' last look."""
    results = run_ranks(planted_job, 2, "gloo", (str(tmp_path), 29, 30))
    assert cli.main(["check", str(tmp_path / "rings")]) == 1
    lead = capsys.readouterr().out.splitlines()[0]
    assert lead.startswith("HANG: rank 1 holds the job up: its GPU has not started allreduce "
                           "#29 of group 0 (default_pg) (called at "), lead
    assert "s before its GPU was last seen; rank 0's GPU started it and waits" in lead, lead
    said = results[0]["said"]
    hangs = [line for line in said if line.startswith("HANG:")]
    assert len(hangs) == 1, said
    assert hangs[0].startswith("HANG: rank 1 holds the job up: its GPU has not started "
                               "allreduce #29 of group 0 (default_pg) (called at "), hangs
    assert f":{results[1]['line']} " in hangs[0] or f":{results[1]['line']})" in hangs[0], hangs
    assert "; rank 0's GPU started it and waits (from the GPU's times)" in hangs[0], hangs


def test_rows_of_gpu_timed_launches_say_so_in_both_formats(late_gpu_run, tmp_path: Path
                                                            ) -> None:
    """A ring's GPU-timed launches are rows whose start and end are the GPU's: the binary rows
    and the Parquet rows (``timed_by`` "gpu", read by DuckDB) keep it; a launch without GPU
    times stays an entry."""
    import duckdb

    from autoannot.traces.table import rows

    out, _ = late_gpu_run
    one = ring_files.read(out / "rings" / "rank1.ring")
    made = ring_files.rows_of([out / "rings" / "rank1.ring"])[0]
    rows.write(made, tmp_path / "r.rows")
    back = rows.to_launches(rows.read(tmp_path / "r.rows"))
    expected = [False] + [True] * STEPS  # (the warm-up barrier was not timed)
    assert [launch.gpu for launch in back] == expected, back[:3]
    assert [launch.start_us for launch in back[1:]] == pytest.approx(
        (one.wall_ns(one.gpu["start_ns"][1:]) / 1e3).tolist()), back[:3]
    assert back[0].end_us is None and all(launch.end_us for launch in back[1:]), back[:3]
    rows.write_parquet(made, tmp_path / "r.rows.parquet")
    timed = duckdb.sql(f"select timed_by, count(*) from '{tmp_path / 'r.rows.parquet'}' "
                       "group by timed_by order by timed_by").fetchall()
    assert timed == [("entry", 1), ("gpu", STEPS)], timed
    assert [launch.gpu for launch in rows.to_launches(rows.read(tmp_path / "r.rows.parquet"))
            ] == expected


def test_the_clocks_thread_never_looks_while_a_graph_is_captured(tmp_path: Path) -> None:
    """A CUDA query from another thread ends a capture in torch's default mode: from the moment
    a capture is about to begin until it ends, the clock's thread makes no look (none of the
    source's calls); then it reads what waited."""
    from autoannot.keep import gpu_clock

    class Counted(PlantedGpu):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def done(self, event: Any) -> bool:
            self.calls += 1
            return super().done(event)

        def anchor(self) -> Any:
            self.calls += 1
            return super().anchor()

    gpu = Counted()
    clock = GpuClock(str(tmp_path / f"rank0{ring_format.GPU_SUFFIX}"), 16, gpu)
    gpu_clock.capture_coming()
    try:
        clock.ended(clock.started(0), True)
        time.sleep(0.05)
        assert gpu.calls == 0 and _times(clock, 1)[1].looked_ns == 0
    finally:
        gpu_clock.capture_over()
    time.sleep(0.05)
    times, state = _times(clock, 1)
    assert gpu.calls > 0 and state.looked_ns > 0 and times["start_ns"][0] > 0, (times, state)
    clock.close()


def test_a_gpu_behind_its_host_for_less_than_the_stall_is_no_hang(late_gpu_run) -> None:
    """A GPU that has not yet started a launch its host entered 1 s ago is a GPU at work (an
    NCCL job's host runs ahead of it): no line, live or from the files; 6 s ago it is named.
    A clock that has not looked for 10 s (its process gone) says nothing live."""
    import dataclasses

    from autoannot.live import watch
    from autoannot.traces.analysis import gpu_hang

    out, _ = late_gpu_run
    reads = [ring_files.read(path) for path in ring_files.in_folder(out / "rings")]
    now = time.monotonic_ns()

    def waiting(entered_s_ago: float, looked_s_ago: float = 0.0) -> list[Any]:
        last = reads[1].count - 1
        state = ring_files.GpuState(now - int(looked_s_ago * 1e9), last,
                                    now - int(entered_s_ago * 1e9), 0)
        return [reads[0], dataclasses.replace(reads[1], gpu_state=state)]

    assert gpu_hang.lines_of(waiting(1.0), watch.GPU_AFTER_S, now) == []
    assert gpu_hang.lines_of(waiting(1.0), watch.GPU_AFTER_S, now, live=False) == []
    lines = gpu_hang.lines_of(waiting(6.0), watch.GPU_AFTER_S, now)
    assert len(lines) == 1 and lines[0].startswith(
        f"HANG: rank 1 holds the job up: its GPU has not started allreduce #{STEPS - 1} of "
        "group 0 (default_pg)"), lines
    assert gpu_hang.lines_of(waiting(16.0, 10.0), watch.GPU_AFTER_S, now) == []


def test_a_launch_below_the_python_api_is_timed_at_its_start_through_the_group_hooks(
        capsys, tmp_path: Path) -> None:
    """Where torch's process groups take hooks (torch >= 2.14), a ``pg.allreduce`` (below the
    Python API: no proxy sees it) gets its GPU start, and no end (its stream is not made to
    wait for it); ``skew`` names rank 1 by the plant from them. (Where torch has no hooks, the
    native observer and the Python layer see such launches: host times only.)"""
    from autoannot.observe import group_hooks

    if not group_hooks.available():
        pytest.skip(f"torch {torch.__version__}'s process groups take no hooks (CI: 2.14.1)")
    results = run_ranks(planted_job, 2, "gloo", (str(tmp_path), None, 40, True))
    for path in ring_files.in_folder(tmp_path / "rings"):
        one = ring_files.read(path)
        mine = [i for i in range(len(one.records))
                if one.kinds[int(one.records["kind"][i])]["group"] == "0"]
        assert len(mine) == 40 and (one.gpu["start_ns"][mine] > 0).all(), path
        assert (one.gpu["end_ns"][mine] == 0).all(), path
    assert cli.main(["skew", "-q", "--json", str(tmp_path / "rings")]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["lead"][0].startswith("rank 1 held the others up most"), found["lead"]
    assert f":{results[1]['line']}" in found["lead"][0], found["lead"]
    late_ms = _late_of(found, 1)
    assert abs(statistics.median(late_ms) - PLANT_MS) <= 0.2 * PLANT_MS, late_ms


STARTUP_PROGRAM = """
import sys
import torch, torch.distributed as dist
from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT
from autoannot.keep.gpu_clock import CudaEvents

sees = sys.argv[1] == "sees"
torch.cuda.is_available = lambda: sees  # (what torch says of its GPUs, planted)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0,
                        world_size=1)
ring = AGENT.state.journals[0]
before = type(ring.gpu_source).__name__
dist.all_reduce(torch.ones(4))  # (the first launch: torch imported, it is asked)
route = AGENT.state.route
print(before, ring.gpu_source is CudaEvents, ring.gpu_source is None, route.general,
      route.ring_only is not None)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("sees", ["sees", "blind"])
def test_a_ring_opened_at_start_up_times_the_gpu_where_torch_sees_one(tmp_path: Path,
                                                                     sees: str) -> None:
    """AUTOANNOT=1 opens the ring before torch is imported: whether to time the GPU is asked at
    the first launch (it was asked at start-up, where torch was not there yet: never timed)."""
    import subprocess
    import sys

    from harness import clean_env, free_port

    from autoannot.cli import HOOK_DIR

    (tmp_path / "program.py").write_text(STARTUP_PROGRAM)
    env = clean_env()
    env.update(AUTOANNOT="1", AUTOANNOT_RING=str(tmp_path / "rings"),
               PYTHONPATH=f"{HOOK_DIR}:{Path(__file__).parents[1]}")
    done = subprocess.run([sys.executable, "program.py", sees, str(free_port())], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    before, timed, untimed, general, fast = done.stdout.split()
    assert before == "CudaIfAny"
    if sees == "sees":  # (a CPU tensor: not timed, but the ring times those on a GPU)
        assert (timed, untimed, general) == ("True", "False", "True")
    else:  # (no GPU: the ring's fast route, as before GPU times)
        assert (timed, untimed, general, fast) == ("False", "True", "False", "True")


def stale_route_rank(rank: int, world: int, out: str) -> Any:
    """(A rank) its first launch on the route made before another thread's first launch
    decided that torch sees no GPU (the ring's source then None)."""
    import agent_hooks as hooks

    import autoannot
    from autoannot.keep.gpu_clock import CudaIfAny
    from autoannot.keep.ring import Ring

    autoannot.enable()
    ring = Ring(f"{out}/rings")
    ring.gpu_source = CudaIfAny(ring, hooks.AGENT.state.rerouted)
    hooks.AGENT.state.open_journal(ring)
    before = hooks.AGENT.state.route
    ring.gpu_source.times((torch.ones(1),), {})  # (the other thread's first launch)
    decided = ring.gpu_source
    hooks.AGENT.state.route = before  # (this thread read the route before it changed)
    t = torch.ones(4)
    dist.all_reduce(t)
    count = ring.count
    hooks.AGENT.state.close_journal(ring)
    ring.close()
    autoannot.disable()
    return {"decided": repr(decided), "sum": float(t.sum()), "count": count}


def test_a_launch_on_the_route_made_before_the_gpu_was_decided_runs(tmp_path: Path) -> None:
    """(Found by the footprint test's threads: an AttributeError reached the job's
    ``all_reduce``.) Two threads' first launches at once: the one still on the route made
    before the other decided runs, written to the ring, untimed."""
    results = run_ranks(stale_route_rank, 1, "gloo", (str(tmp_path),))
    assert results[0] == {"decided": "None", "sum": 4.0, "count": 1}, results

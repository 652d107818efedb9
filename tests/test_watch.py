"""Left on in production: the always-on ring (``AUTOANNOT_RING``) and the live watch
(``AUTOANNOT_WATCH=1``, ``autoannot watch``), on real 4-rank gloo jobs hung at a known rank
and collective (``hang_jobs``). The answers come from the plants, never from the tools."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import hang_jobs as job
import pytest
from test_hang import _lead, _mesh_answers

from autoannot import cli
from autoannot.keep import ring
from autoannot.keep.records import new_record
from autoannot.traces import files
from autoannot.traces.read import ring_files

INTERVAL_S, STALL_S = 0.5, 1.0
#: The collectives' timeout in the live jobs: the watch must speak well before it.
TIMEOUT_S = 60


def _watched(monkeypatch, folder: Path) -> None:
    monkeypatch.setenv("AUTOANNOT_RING", str(folder))
    monkeypatch.setenv("AUTOANNOT_WATCH", "1")
    monkeypatch.setenv("AUTOANNOT_WATCH_INTERVAL", str(INTERVAL_S))
    monkeypatch.setenv("AUTOANNOT_WATCH_STALL", str(STALL_S))


def _start(kind: str, out: Path) -> tuple[threading.Thread, dict[str, Any]]:
    ran: dict[str, Any] = {}

    def go() -> None:
        try:
            ran["results"] = job.run(kind, out, TIMEOUT_S)
        except BaseException as exc:  # (said by the test, not lost in the thread)
            ran["error"] = exc

    worker = threading.Thread(target=go)
    worker.start()
    return worker, ran


def _signal_state(pid: int) -> str:
    """Whether SIGINT is blocked or ignored in process ``pid`` (its /proc status) and what
    this process does with it: what a Ctrl-C that is not obeyed is to be read against."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        status = ""
    masks = {line.split(":")[0]: int(line.split(":")[1], 16) for line in status.splitlines()
             if line.startswith(("SigBlk", "SigIgn", "SigCgt"))}
    bit = 1 << (signal.SIGINT - 1)
    return (f"SIGINT in the watch: {', '.join(k for k, v in masks.items() if v & bit) or '?'}; "
            f"here: {signal.getsignal(signal.SIGINT)!r}, blocked "
            f"{signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])}")


def _watch_lines(err: str) -> list[str]:
    """What the watcher said of the hang: from its first 'no rank has launched a collective'."""
    lines = [line.strip() for line in err.splitlines()]
    first = next(i for i, line in enumerate(lines)
                 if "no rank has launched a collective for" in line)
    return lines[first:]


def _last_entry_s(folder: Path, rank: int) -> float:
    """When ``rank`` entered its last launch (its ring's monotonic clock: this host's)."""
    one = ring_files.read(folder / f"rank{rank}{ring.SUFFIX}")
    return float(one.records["entered_ns"].max()) / 1e9


@pytest.mark.parametrize(("kind", "store"), [("frozen", None), ("sleep", None),
                                             ("sleep", "job")])
def test_a_hang_is_named_live_by_rank_0_before_the_timeout(capfd, monkeypatch, tmp_path: Path,
                                                           kind: str, store: str | None) -> None:
    """Rank 3 stops after step 5's tp all-reduce (its process stopped; or asleep, alive):
    rank 0's watcher says the mesh's answer in the job's log within ``STALL_S`` and two looks
    of the last launch, while the others still wait (long before their timeout), once; the
    job then finishes as it would unwatched. ``store``: every rank publishes its progress to
    the job's own c10d store (``AUTOANNOT_WATCH_STORE=job``), and rank 0 reads it there, as
    across hosts."""
    rings = tmp_path / "rings"
    _watched(monkeypatch, rings)
    if store is not None:
        monkeypatch.setenv("AUTOANNOT_WATCH_STORE", store)
    worker, ran = _start(kind, tmp_path)
    err, said_at = "", None
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while said_at is None and worker.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
            err += capfd.readouterr().err
            if "rank 1 in" in err:
                said_at = time.monotonic()
                latest = max(_last_entry_s(rings, r) for r in range(job.WORLD))
        assert said_at is not None, err
        assert worker.is_alive(), "the job ended before the watch said its hang"
    finally:
        if kind == "frozen" and (tmp_path / job.FROZEN_PID).exists():  # go on
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / job.FROZEN_PID).read_text()), signal.SIGCONT)
        worker.join(TIMEOUT_S + 30)
    assert "error" not in ran, ran.get("error")
    assert all(r["stuck"] is None for r in ran["results"])  # nobody timed out
    err += capfd.readouterr().err
    lines = _watch_lines(err)
    _mesh_answers(lines[1:], ran["results"][0]["sites"])
    assert err.count("no rank has launched") == 1  # said once, not at every look
    assert ("from the store at 127.0.0.1:" in err) == (store is not None), err
    waited = said_at - latest  # (the last launch of any rank: where the hang began)
    assert waited < STALL_S + 2 * INTERVAL_S + 1.0, waited  # (+1 s: a busy 2-core host)
    print(f"{kind}: said {waited:.2f} s after the last launch (stall {STALL_S} s, "
          f"a look every {INTERVAL_S} s)")


def test_the_rings_a_hung_job_left_name_its_culprit(capsys, monkeypatch, tmp_path: Path) -> None:
    """A job that left its rings (rank 3 stopped for good: its process gone): ``autoannot
    watch --once``, ``skew``, ``check`` and ``report`` name it from the rings alone, and from
    the rings with the record files, exit 1; so does ``watch --once --store`` from the
    progress each rank's publisher put in a TCPStore from them (a store that does not answer:
    exit 2); a finished job's rings: no hang, exit 0."""
    rings = tmp_path / "rings"
    monkeypatch.setenv("AUTOANNOT_RING", str(rings))
    results = job.run("mesh", tmp_path, 20)
    code = cli.main(["watch", "--once", str(rings)])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    sites = results[0]["sites"]
    _mesh_answers([line.strip() for line in out], sites)
    both = tmp_path / "both"
    both.mkdir()
    for path in [*rings.iterdir(), *tmp_path.glob("*.jsonl")]:
        shutil.copy(path, both / path.name)
    for folder in (rings, both):
        for name, (code, lines) in _lead(capsys, tmp_path, folder).items():
            assert code == 1, (folder, name)
            _mesh_answers([line.strip() for line in lines], sites)
    # the same rings' progress, published to a TCPStore as the ranks publish it, read there
    from datetime import timedelta

    import torch.distributed as dist
    from harness import free_port

    from autoannot.keep import publish

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    for rank in range(job.WORLD):
        one = ring.Ring(str(rings), 4)  # (stands for the rank's own: its file, as written)
        one.ring_path = str(rings / f"rank{rank}{ring.SUFFIX}")
        one._count = ring_files.read(Path(one.ring_path), 0).count
        assert publish.Publisher(one, publish.connect(("127.0.0.1", port))).publish_once()
    code = cli.main(["watch", "--once", "--store", f"127.0.0.1:{port}"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    _mesh_answers([line.strip() for line in out], sites)
    assert not any("last published" in line for line in out)  # (published after it all)
    # rank 3's progress as a stopped process leaves it: published before the others' last
    # launch (here: before its own last launch); the culprit is said to be so
    from autoannot.base.ring_format import progress_key
    from autoannot.traces.read import rank_progress

    culprit = ring_files.read(rings / f"rank3{ring.SUFFIX}")
    before = int(culprit.wall_ns(culprit.records["entered_ns"].max())) - 1_000_000
    server.set(progress_key(3), rank_progress.encode(rank_progress.of_ring(
        culprit, publish.TAIL, published_ns=before)))
    assert cli.main(["watch", "--once", "--store", f"127.0.0.1:{port}"]) == 1
    out = capsys.readouterr().out
    assert "(rank 3 last published its progress" in out and "ms before the others'" in out, out
    assert cli.main(["watch", "--once", "--store", f"127.0.0.1:{free_port()}"]) == 2
    assert "no store answers" in capsys.readouterr().err
    del server
    clean = tmp_path / "clean"
    monkeypatch.setenv("AUTOANNOT_RING", str(clean))
    job.run("clean", tmp_path, 20)
    code = cli.main(["watch", "--once", str(clean)])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("no hang: 4 ranks"), out


def test_watch_refuses_what_is_no_folder_of_rings(capsys, tmp_path: Path) -> None:
    assert cli.main(["watch", "--once", str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert cli.main(["watch", "--once", str(tmp_path)]) == 1  # (no rings: never an all-clear)
    assert "no ring files" in capsys.readouterr().err


# --- the ring itself ---------------------------------------------------------------------------

ANNOTATION = {"Collective name": "allreduce", "Process Group Name": "0", "Group size": 1,
              "dtype": "Float", "In msg nelems": 8, "Out msg nelems": 8}


def _entry(site: str) -> Any:
    return new_record("all_reduce", ANNOTATION, site, {})


def _only_ring(folder: Path) -> Path:
    """The one ring in ``folder`` (``rank{R}.ring`` where this process has a rank, else
    ``pid{P}.ring``)."""
    found = list(folder.glob(f"*{ring.SUFFIX}"))
    assert len(found) == 1, found
    return found[0]


def test_a_ring_keeps_the_last_launches_in_order_and_their_ends(tmp_path: Path) -> None:
    """10 launches into a ring of 4: the last 4, oldest first, each with its seq, its call
    site and an end after its entry (or failed); the file is 64 + 4 x 48 bytes."""
    kept = ring.Ring(str(tmp_path), 4)
    for i in range(10):
        kept.enter(_entry(f"train.py:{i % 3}"))
        kept.returned(failed=i == 9)
    kept.close()
    path = _only_ring(tmp_path)
    assert path.stat().st_size == ring.ring_bytes(4) == 64 + 4 * 48
    one = ring_files.read(path)
    assert one.count == 10
    assert list(one.records["seq"]) == [6, 7, 8, 9]
    assert [one.sites[s] for s in one.records["site"]] == [f"train.py:{i % 3}"
                                                            for i in range(6, 10)]
    ends = one.records["returned_ns"]
    assert all(ends[:3] >= one.records["entered_ns"][:3]) and ends[3] == ring.FAILED
    assert one.kinds[0]["annotation"] == ANNOTATION


def test_a_ring_read_while_a_launch_runs_has_it_unended(tmp_path: Path) -> None:
    kept = ring.Ring(str(tmp_path), 8)
    kept.enter(_entry("a.py:1"))
    one = ring_files.read(_only_ring(tmp_path))
    assert one.count == 1 and one.records["returned_ns"][0] == 0
    kept.close()


def test_a_tally_counts_a_launch_entered_while_it_reads(monkeypatch, tmp_path: Path) -> None:
    """A ring read while the job launches (the watcher's and the publisher's metrics): a
    launch entered between the tally's read of the header and of the records is counted,
    once, like every other (before, the launch the read should have started at was lost for
    good: a live job's metrics fell short, 199 of 200)."""
    from autoannot.traces.read import ring_tally

    kept = ring.Ring(str(tmp_path), 64)
    for i in range(5):
        kept.enter(_entry(f"train.py:{i}"))
        kept.returned()
    path = _only_ring(tmp_path)
    tally = ring_tally.Tally()
    tally.update(path)
    kept.enter(_entry("train.py:5"))  # (counted at the next update, with what comes during it)
    kept.returned()
    read = ring_files.read

    def read_while_launching(at: Path, last: int | None = None) -> Any:
        one = read(at, last)
        if last == 0:  # (the header: the job enters one more before the records are read)
            kept.enter(_entry("train.py:6"))
            kept.returned()
        return one

    monkeypatch.setattr(ring_files, "read", read_while_launching)
    tally.update(path)
    monkeypatch.setattr(ring_files, "read", read)
    tally.update(path)
    kept.close()
    assert sum(tally.launches.values()) == 7 == ring_files.read(path).count


def test_what_is_no_ring_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / f"x{ring.SUFFIX}"
    bad.write_bytes(b"not a ring at all" * 8)
    with pytest.raises(files.TraceError, match="not an autoannot ring file"):
        ring_files.read(bad)


def test_a_ring_of_no_launches_is_refused_at_start_up(tmp_path: Path) -> None:
    env = {**os.environ, "AUTOANNOT": "1", "AUTOANNOT_RING": str(tmp_path),
           "AUTOANNOT_RING_LAUNCHES": "0"}
    done = subprocess.run([sys.executable, "-c", "import autoannot._startup"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert "AUTOANNOT_RING_LAUNCHES" in done.stderr and "no ring is kept" in done.stderr


# --- the watch never changes the job ----------------------------------------------------------

def test_a_watcher_killed_or_failing_mid_run_leaves_the_job_as_it_was(capfd, monkeypatch,
                                                                        tmp_path: Path) -> None:
    """The clean mesh job, unwatched; then with ``autoannot watch`` attached to its rings and
    killed (SIGKILL) mid-run, and rank 0's own watcher failing mid-run (its folder taken away
    under it): the job finishes, every rank's values bit-identical to the unwatched run's; the
    failure said once, the job not stopped."""
    (tmp_path / "plain").mkdir()
    plain = job.run("clean", tmp_path / "plain", 20)
    rings = tmp_path / "rings"
    _watched(monkeypatch, rings)
    monkeypatch.setenv("AUTOANNOT_WATCH_INTERVAL", "0.05")
    out = tmp_path / "watched"
    out.mkdir()
    worker, ran = _start("clean", out)
    while not rings.is_dir() or not list(rings.glob(f"*{ring.SUFFIX}")):
        time.sleep(0.02)
    attached = subprocess.Popen([sys.executable, "-m", "autoannot", "watch", "--interval",
                                 "0.05", str(rings)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    time.sleep(0.3)
    attached.kill()  # the watcher, mid-run
    attached.wait(30)
    shutil.rmtree(rings)  # rank 0's watcher's folder, gone mid-run (the rings stay mapped)
    worker.join(TIMEOUT_S + 30)
    assert not worker.is_alive() and "error" not in ran, ran.get("error")
    assert attached.returncode == -signal.SIGKILL
    assert [r["values"] for r in ran["results"]] == [r["values"] for r in plain]
    assert all(r["stuck"] is None for r in ran["results"])
    err = capfd.readouterr().err
    assert err.count("AUTOANNOT_WATCH stopped") == 1, err
    assert "the job goes on unwatched" in err


# --- stragglers, live -------------------------------------------------------------------------

def test_a_store_that_cannot_be_reached_leaves_the_job_as_it_was(capfd, monkeypatch,
                                                                 tmp_path: Path) -> None:
    """``AUTOANNOT_WATCH_STORE`` naming a port where no store listens: the clean mesh job
    finishes (in the time the store's clients still try to connect), every rank's values
    bit-identical to an unwatched run's; then a publisher whose store cannot be reached says
    so once and ends."""
    from harness import free_port

    (tmp_path / "plain").mkdir()
    plain = job.run("clean", tmp_path / "plain", 20)
    _watched(monkeypatch, tmp_path / "rings")
    monkeypatch.setenv("AUTOANNOT_WATCH_STORE", f"127.0.0.1:{free_port()}")
    (tmp_path / "watched").mkdir()
    results = job.run("clean", tmp_path / "watched", TIMEOUT_S)
    assert [r["values"] for r in results] == [r["values"] for r in plain]
    from autoannot.keep import publish

    one = ring.Ring(str(tmp_path / "alone"), 4)
    one.enter(new_record("all_reduce", {"Collective name": "allreduce"}, "here.py:1", {}))
    capfd.readouterr()
    began = time.monotonic()
    publish._publish(one, ("127.0.0.1", free_port()), 0.05)  # (returns: it ends)
    assert time.monotonic() - began < 6 * publish.TIMEOUT_S  # (torch's client retries)
    err = capfd.readouterr().err
    assert err.count("progress no longer published") == 1, err


def _watch_run(kind: str, monkeypatch, tmp_path: Path, capfd) -> tuple[list[dict], list[str]]:
    rings = tmp_path / "rings"
    _watched(monkeypatch, rings)
    monkeypatch.setenv("AUTOANNOT_WATCH_INTERVAL", "0.2")
    results = job.run(kind, tmp_path, TIMEOUT_S)
    said = [line.strip() for line in capfd.readouterr().err.splitlines()
            if line.startswith("autoannot watch:")]
    return results, said


def test_a_rank_late_every_step_is_named_a_straggler_within_50_steps(capfd, monkeypatch,
                                                                     tmp_path: Path) -> None:
    """Rank 2 sleeps 20 ms before each step's broadcast (200 steps): rank 0's watcher names
    it, and no other rank, at the broadcast's call site, late by the plant, from instances
    before step 50; rank 0, held in that broadcast and so last at its next tp all-reduce, is
    not named."""
    results, said = _watch_run("late", monkeypatch, tmp_path, capfd)
    named = [line for line in said if "STRAGGLER" in line]
    assert named, said
    assert all(f"STRAGGLER: rank {job.LATE_RANK} " in n and "group 0 (default_pg)" in n
               for n in named), said  # (said again only after "no longer stands out")
    line = named[0]
    assert line.startswith(f"autoannot watch: STRAGGLER: rank {job.LATE_RANK} arrived last "), line
    assert "of group 0 (default_pg)'s last" in line, line
    assert line.endswith(f"its call site {results[job.LATE_RANK]['sites']['broadcast']}"), line
    last_seen = int(line.split(" collectives (#")[1].split("-#")[1].split(")")[0])
    assert last_seen < 50, line  # (group 0's #k: step k's broadcast)
    waited_ms = float(line.split("the others waiting ")[1].split(" ms")[0])
    assert abs(waited_ms - job.LATE_S * 1e3) <= 0.25 * job.LATE_S * 1e3, line
    lead = _offline_lead(capfd, tmp_path / "rings")  # (and the offline lead says so too)
    assert lead.startswith(f"rank {job.LATE_RANK} held the others up most"), lead
    # Rank 2 on a second host, its monotonic clock 37 ms behind: the straggler window through
    # the store's documents still names it alone, by its time outside collectives.
    found = _across_hosts(tmp_path / "rings", job.LATE_RANK, -CLOCK_OFFSET_US)
    assert [(s.rank, s.group, s.by_time_outside) for s in found] == [
        (job.LATE_RANK, "0", True)], found
    assert abs(found[0].late_by_us - job.LATE_S * 1e6) <= 0.25 * job.LATE_S * 1e6, found


#: A planted offset between two hosts' monotonic clocks (us).
CLOCK_OFFSET_US = 37_000.0


def _across_hosts(rings: Path, moved: int, offset_us: float) -> list[Any]:
    """The straggler window as the watcher reads it from the store (the ranks' progress
    documents, made from the job's real rings), where rank ``moved`` ran on a second host whose
    monotonic clock reads ``offset_us`` more than the first's (a planted offset)."""
    from autoannot.keep import publish
    from autoannot.traces.analysis import stragglers
    from autoannot.traces.read import rank_progress
    from autoannot.traces.render import watch

    documents = []
    for path in ring_files.in_folder(rings):
        one = ring_files.read(path, watch.TAIL)
        document = rank_progress.decode(rank_progress.encode(
            rank_progress.of_ring(one, publish.TAIL)))
        assert document is not None and document["host"] == one.meta["host"]
        if document["rank"] == moved:
            document["host"] = f"{document['host']}-second"
            document["base_us"] += int(offset_us)
        documents.append(document)
    entered, gaps, members, _, clocks = rank_progress.tails_of(documents)
    return stragglers.stragglers(entered, members, gaps=gaps, clocks=clocks)


def _offline_lead(capfd, rings: Path) -> str:
    """``autoannot skew``'s first line on a job's rings."""
    capfd.readouterr()
    assert cli.main(["skew", "-q", "--json", str(rings)]) == 0
    return json.loads(capfd.readouterr().out)["lead"][0]


def test_a_job_with_nothing_planted_names_no_straggler(capfd, monkeypatch,
                                                        tmp_path: Path) -> None:
    """200 steps, nothing planted: the watcher names no rank, and neither does the offline
    lead on the same rings (before, it named the rank of the largest delay: noise)."""
    _, said = _watch_run("steady", monkeypatch, tmp_path, capfd)
    assert not any("STRAGGLER" in line for line in said), said
    lead = _offline_lead(capfd, tmp_path / "rings")
    assert lead.startswith("no rank stands out of the job's own noise"), lead
    # Rank 3 on a second host whose clock reads 37 ms ahead: no rank is named (the offset is
    # no lateness; compared as entry times, rank 3 arrived "last" at every instance).
    assert _across_hosts(tmp_path / "rings", 3, CLOCK_OFFSET_US) == []


# --- Prometheus -------------------------------------------------------------------------------

def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The endpoint's samples as Prometheus reads them (its own text parser)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        text = page.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _is_the_late_jobs(got: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> None:
    """The late job's figures, from its plant: every rank's launches of each of its groups
    (one a step), time in collectives, rank 2's straggler wait alone (the 20 ms), no hang."""
    for rank in range(job.WORLD):
        for group, collective in (("0", "broadcast"), (str(1 + rank // 2), "allreduce"),
                                  (str(3 + rank % 2), "allreduce")):
            key = ("autoannot_collectives_total", (("collective", collective),
                                                   ("group", group), ("rank", str(rank))))
            assert got.get(key) == job.LONG_STEPS, (key, got.get(key))
        assert got[("autoannot_collective_seconds_total",
                    (("group", "0"), ("rank", str(rank))))] > 0
    late = {k: v for k, v in got.items() if k[0] == "autoannot_straggler_wait_seconds"}
    assert list(late) == [("autoannot_straggler_wait_seconds",
                           (("group", "0"), ("rank", str(job.LATE_RANK))))], late
    assert abs(next(iter(late.values())) - job.LATE_S) <= 0.25 * job.LATE_S
    assert got[("autoannot_hang_culprit_rank", ())] == -1


def test_the_metrics_of_a_late_job_are_its_launches_its_time_and_its_straggler(
        capsys, monkeypatch, tmp_path: Path) -> None:
    """The late job's rings, watched once with metrics served: every rank's launches of each
    group as the job made them, time in collectives, rank 2's straggler wait (the plant)
    alone, no hang."""
    from harness import free_port

    from autoannot.traces.render.metrics import JobMetrics
    from autoannot.traces.render.watch import Watcher

    rings = tmp_path / "rings"
    monkeypatch.setenv("AUTOANNOT_RING", str(rings))
    job.run("late", tmp_path, TIMEOUT_S)
    metrics = JobMetrics()
    server = metrics.serve(port := free_port(), "127.0.0.1")
    try:
        Watcher(rings, STALL_S, lambda line: None, metrics=metrics).look()
        got = _scrape(port)
    finally:
        if isinstance(server, tuple):
            server[0].shutdown()
    _is_the_late_jobs(got)


def test_the_metrics_through_a_store_are_the_ranks_own_totals(monkeypatch,
                                                              tmp_path: Path) -> None:
    """The late job publishing to a store the test holds (``AUTOANNOT_WATCH_STORE``, no
    watcher in the job): a watcher of that store, once the job is done, serves every rank's
    launches of each group as the job made them (the ranks' own totals, complete: published
    once more at exit), time in collectives, and rank 2's straggler wait (the plant) alone."""
    from datetime import timedelta

    import torch.distributed as dist
    from harness import RUN_EXIT_FUNCTIONS, free_port

    from autoannot.keep.publish import connect
    from autoannot.traces.render.metrics import JobMetrics
    from autoannot.traces.render.watch import StoreProgress, Watcher

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    monkeypatch.setenv("AUTOANNOT_RING", str(tmp_path / "rings"))
    monkeypatch.setenv("AUTOANNOT_WATCH_STORE", f"127.0.0.1:{port}")
    monkeypatch.setenv("AUTOANNOT_WATCH_INTERVAL", "0.2")
    monkeypatch.setenv(RUN_EXIT_FUNCTIONS, "1")  # (the ranks exit as a job's do)
    job.run("late", tmp_path, TIMEOUT_S)
    metrics = JobMetrics()
    served = metrics.serve(metrics_port := free_port(), "127.0.0.1")
    try:
        watcher = Watcher(StoreProgress(connect(("127.0.0.1", port)), f"127.0.0.1:{port}"),
                          STALL_S, lambda line: None, metrics=metrics)
        watcher.look()  # (the documents read: stragglers)
        watcher.look()  # (and metered)
        got = _scrape(metrics_port)
    finally:
        if isinstance(served, tuple):
            served[0].shutdown()
        del server
    _is_the_late_jobs(got)


def test_a_live_hang_shows_on_rank_0s_endpoint(capfd, monkeypatch, tmp_path: Path) -> None:
    """``AUTOANNOT_WATCH_PROMETHEUS``: while rank 3 is stopped, rank 0's endpoint says it is
    the hang's culprit; the job then finishes as it would unwatched."""
    from harness import free_port

    rings = tmp_path / "rings"
    _watched(monkeypatch, rings)
    monkeypatch.setenv("AUTOANNOT_WATCH_PROMETHEUS", str(port := free_port()))
    worker, ran = _start("frozen", tmp_path)
    culprit = None
    try:
        deadline = time.monotonic() + TIMEOUT_S / 2
        while culprit in (None, -1) and worker.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                culprit = _scrape(port).get(("autoannot_hang_culprit_rank", ()))
            except OSError:  # (not serving yet)
                continue
    finally:
        if (tmp_path / job.FROZEN_PID).exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / job.FROZEN_PID).read_text()), signal.SIGCONT)
        worker.join(TIMEOUT_S + 30)
    assert culprit == 3
    assert "error" not in ran and all(r["stuck"] is None for r in ran["results"])


# --- rows at export, named by the ring --------------------------------------------------------

def test_gloo_rows_are_written_from_the_ring_alone(capsys, monkeypatch, tmp_path: Path) -> None:
    """A gloo job profiled on a schedule with ``AUTOANNOT_RING`` and no record file: each rank
    writes its rows beside its trace (gloo's ranges named by the ring's launches): a row for
    every collective it profiled, and ``skew`` on them leads with the plant (rank 2 late at its
    broadcast)."""
    import json

    import user_jobs

    from autoannot.traces.table import rows

    monkeypatch.setenv("AUTOANNOT_RING", str(tmp_path / "rings"))
    results = user_jobs.run("shared", tmp_path, record=None)
    assert not list(tmp_path.glob("*.jsonl"))
    made = sorted(tmp_path.glob("trace_rank?.rows*"))
    assert len(made) == user_jobs.WORLD, sorted(p.name for p in tmp_path.iterdir())
    for path in made:
        one = rows.read(path)
        assert len(one) == 2 * user_jobs.STEPS + 2  # (each step's 2, and the 2 warm-ups)
        assert all(site >= 0 for site in one.columns["site"])  # (every one named)
    code = cli.main(["skew", "-q", "--json", *map(str, made)])
    said = json.loads(capsys.readouterr().out)
    assert code == 0, said["problems"]
    top = said["origins"][0]
    site = results[user_jobs.PLANTED_RANK]["sites"]["broadcast"]
    assert (top["rank"], top["call_site"]) == (user_jobs.PLANTED_RANK, site), top


def test_a_ring_that_cannot_be_kept_is_said_once_and_the_launches_go_on(tmp_path: Path) -> None:
    """``AUTOANNOT_RING`` naming a path under a file: the job's collectives run and return what
    they do without the agent, one line says why no ring is kept."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    script = ("import torch, torch.distributed as dist\n"
              "from torch.testing._internal.distributed.fake_pg import FakeStore\n"
              "dist.init_process_group('fake', store=FakeStore(), rank=0, world_size=2)\n"
              "t = torch.ones(4)\n"
              "print([dist.all_reduce(t) for _ in range(3)], float(t.sum()))\n")
    env = {**os.environ, "AUTOANNOT": "1", "AUTOANNOT_RING": str(blocker / "rings")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    plain = subprocess.run([sys.executable, "-c", script], env={
        k: v for k, v in os.environ.items() if not k.startswith("AUTOANNOT")},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 == plain.returncode, done.stderr
    assert done.stdout == plain.stdout
    assert done.stderr.count("no ring is kept") == 1, done.stderr


def test_autoannot_watch_attached_says_a_live_hang(monkeypatch, tmp_path: Path) -> None:
    """``autoannot watch DIR`` from outside the job, attached while it runs: the frozen mesh's
    answer on its stdout while rank 3 is stopped; Ctrl-C (SIGINT) ends it, exit 130."""
    rings = tmp_path / "rings"
    monkeypatch.setenv("AUTOANNOT_RING", str(rings))
    worker, ran = _start("frozen", tmp_path)
    watcher = None
    out = tmp_path / "watch.out"
    try:
        while not (tmp_path / job.FROZEN_PID).exists() and worker.is_alive():
            time.sleep(0.05)
        with out.open("w") as sink:
            watcher = subprocess.Popen(  # (-X faulthandler: where it is, if it hangs)
                [sys.executable, "-X", "faulthandler", "-m", "autoannot", "watch",
                 "--interval", "0.1", "--stall", "0.5", str(rings)], stdout=sink,
                stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "rank 1 in" not in out.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert worker.is_alive(), "the job ended before the watch said its hang"
        assert "rank 1 in" in out.read_text(), f"no hang said in 60 s:\n{out.read_text()}"
        dispositions = _signal_state(watcher.pid)  # (said if the Ctrl-C is not obeyed)
        watcher.send_signal(signal.SIGINT)
        try:
            code = watcher.wait(30)
        except subprocess.TimeoutExpired:  # (said below, with what the watch printed and
            code = None  # its threads' stacks: seen once in a full run here, the machine loaded)
            watcher.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                watcher.wait(10)
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
        if (tmp_path / job.FROZEN_PID).exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / job.FROZEN_PID).read_text()), signal.SIGCONT)
        worker.join(TIMEOUT_S + 30)
    said = out.read_text()
    assert code == 130, f"{said}\nbefore the Ctrl-C: {dispositions}"
    assert "Traceback" not in said, said
    _mesh_answers(_watch_lines(said)[1:], ran["results"][0]["sites"])
    assert "interrupted" in said

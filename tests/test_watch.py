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
import numpy as np
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


def _start(kind: str, out: Path, **job_args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """The job ``kind`` run in a thread; what it returned (``results``), raised (``error``),
    and when it started (``began``: this host's monotonic clock)."""
    ran: dict[str, Any] = {"began": time.monotonic()}

    def go() -> None:
        try:
            ran["results"] = job.run(kind, out, TIMEOUT_S, **job_args)
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


def _first_entry_s(folder: Path, rank: int) -> float:
    """When ``rank`` entered its first launch (its ring's monotonic clock: this host's)."""
    one = ring_files.read(folder / f"rank{rank}{ring.SUFFIX}")
    return float(one.records["entered_ns"].min()) / 1e9


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

    from autoannot.live import publish

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
    from autoannot.live import progress as rank_progress

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
    """Bad input is exit 2 (as the help says), and no all-clear is said of a ring that could
    not be read: no folder, an empty one, random bytes named ``rank0.ring``, a ring cut to 100
    bytes; a folder where one of two rings is cut says what the other shows, and exit 2 (before:
    exit 1, and ``no hang: 0 ranks' rings``)."""
    assert cli.main(["watch", "--once", str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["watch", "--once", str(empty)]) == 2  # (no rings: never an all-clear)
    said = capsys.readouterr()
    assert "no ring files" in said.err and said.out == ""
    noise = tmp_path / "noise"
    noise.mkdir()
    (noise / f"rank0{ring.SUFFIX}").write_bytes(os.urandom(4096))
    cut = tmp_path / "cut"
    for rank in (0, 1):
        _a_ring(cut, rank, launches=3)
    with open(cut / f"rank0{ring.SUFFIX}", "r+b") as f:
        f.truncate(100)
    for folder, read in ((noise, None), (cut, "rank 1's")):
        assert cli.main(["watch", "--once", str(folder)]) == 2, folder
        said = capsys.readouterr()
        assert "no hang:" not in said.out, said.out
        assert f"rank0{ring.SUFFIX}: cannot be read (" in said.err, said.err
        assert (read is None) == (said.out == ""), said.out
        if read is not None:
            assert said.out.startswith(f"no hang among the rings read ({read})"), said.out
        assert cli.main(["watch", "--once", "--json", str(folder)]) == 2
        assert json.loads(capsys.readouterr().out)["unreadable"], folder


def test_watch_attached_says_what_it_cannot_read_and_keeps_looking(tmp_path: Path) -> None:
    """``autoannot watch DIR`` attached to an empty folder says so once and keeps looking; a
    ring that appears is read (no word); one cut short is said once, by name; Ctrl-C ends it,
    exit 130 (before: its banner, then nothing)."""
    folder = tmp_path / "rings"
    folder.mkdir()
    out = tmp_path / "watch.out"
    with out.open("w") as sink:
        watcher = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-m", "autoannot", "watch", "--interval",
             "0.1", str(folder)], stdout=sink, stderr=subprocess.STDOUT)
    try:
        def said_once(words: str) -> None:
            deadline = time.monotonic() + 60
            while words not in out.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert out.read_text().count(words) == 1, out.read_text()

        said_once(f"no ring in {folder} yet")
        _a_ring(folder, 0, launches=3)
        _a_ring(folder, 1, launches=2)
        with open(folder / f"rank1{ring.SUFFIX}", "r+b") as f:
            f.truncate(100)
        said_once(f"rank1{ring.SUFFIX}: cannot be read (cut short")
        time.sleep(1.0)  # (ten more looks: said once, not at each)
        watcher.send_signal(signal.SIGINT)
        code = watcher.wait(30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    said = out.read_text()
    assert code == 130, said
    assert said.count(f"no ring in {folder} yet") == 1
    assert said.count("cannot be read") == 1 and f"rank0{ring.SUFFIX}" not in said, said
    assert "Traceback" not in said, said


def _a_ring(folder: Path, rank: int, launches: int) -> Path:
    """A ring of ``launches`` all-reduces, written by the ring itself, put in ``folder`` as rank
    ``rank``'s of a run named ``one``."""
    made = folder.parent / f".made-{folder.name}-{rank}"
    kept = ring.Ring(str(made), 64)
    for i in range(launches):
        kept.enter(_entry(f"train.py:{i}"))
        kept.returned()
    kept.close()
    path = _only_ring(made)
    lines = ring_files.names_of(path).read_text().splitlines()
    meta = {**json.loads(lines[0]), "rank": rank, "run": "one"}
    folder.mkdir(exist_ok=True)
    target = folder / f"rank{rank}{ring.SUFFIX}"
    target.write_bytes(path.read_bytes())
    ring_files.names_of(target).write_text("\n".join([json.dumps(meta), *lines[1:]]) + "\n")
    shutil.rmtree(made)
    return target


def test_groups_made_without_a_description_are_named_by_their_ranks(capsys, monkeypatch,
                                                                    tmp_path: Path) -> None:
    """The mesh hang with its tp and dp groups made without ``group_desc`` (torch records
    ``undefined``): the watch, ``check``, ``skew``, ``report`` and ``summary`` name each of those
    groups by its ranks (rank 3's last launch in group 2 [2, 3], rank 1 blocked in group 4
    [1, 3]), the default group by its description, and never ``undefined``; so do the metrics'
    labels (before: ``group 2 (undefined)``, and in tables ``undefined (2)``)."""
    from harness import free_port

    from autoannot.live.metrics import JobMetrics
    from autoannot.live.watch import Watcher

    rings = tmp_path / "rings"
    monkeypatch.setenv("AUTOANNOT_RING", str(rings))
    job.run("mesh", tmp_path, 20, described=False)
    said = {}
    for name, args in (("watch", ["--once", str(rings)]), ("check", [str(tmp_path)]),
                       ("skew", [str(tmp_path)]), ("summary", [str(tmp_path)]),
                       ("report", [str(tmp_path), "-o", str(tmp_path / "page.html")])):
        cli.main([name, *args])
        said[name] = capsys.readouterr().out
    for name in ("watch", "check", "skew", "report"):
        text = said[name]
        assert f"Its last launch was allreduce #{job.STOP_STEP} of group 2 [2, 3] at" in text, text
        assert f"rank 1 in allreduce #{job.STOP_STEP} of group 4 [1, 3] at" in text, text
        assert "of group 0 (default_pg) at" in text and "undefined" not in text, text
    table = said["summary"]
    assert all(f"{ranks} ({group})" in table for group, ranks in (
        ("1", "[0, 1]"), ("2", "[2, 3]"), ("3", "[0, 2]"), ("4", "[1, 3]"))), table
    assert "default_pg (0)" in table and "undefined" not in table, table
    metrics = JobMetrics()
    server = metrics.serve(port := free_port(), "127.0.0.1")
    try:
        Watcher(rings, STALL_S, lambda line: None, metrics=metrics).look()
        got = _scrape(port)
    finally:
        if isinstance(server, tuple):
            server[0].shutdown()
    labels = {dict(key[1])["group"]: dict(key[1])["group_desc"] for key in got
              if key[0] == "autoannot_collectives_total"}
    assert labels == {"0": "default_pg", "1": "[0, 1]", "2": "[2, 3]", "3": "[0, 2]",
                      "4": "[1, 3]"}, labels


def test_a_group_is_called_by_its_ranks_short_where_it_is_large() -> None:
    """What a group is called where it has no description: its ranks, a large group's as
    first-last/stride, or first ranks, last and size where they are not evenly spaced."""
    from autoannot.traces import names

    assert names.group_label("3", "undefined", (0, 2)) == "3 [0, 2]"
    assert names.group_label("1", "tp", (0, 1)) == "1 (tp)"
    assert names.group_label("5", "", None) == "5"
    assert names.group_desc("undefined", tuple(range(1024))) == "[0-1023]"
    assert names.group_desc("", tuple(range(1, 64, 2))) == "[1-63/2]"
    odd = (0, 1, 5, 7, 9, 11, 13, 15, 17, 1021)
    assert names.group_desc("undefined", odd) == "[0, 1, 5, ..., 1021] (10 ranks)"
    assert names.group_column("2", "undefined", (2, 3)) == "[2, 3] (2)"


def test_old_runs_folders_go_but_the_newest_and_those_still_running(monkeypatch,
                                                                     tmp_path: Path) -> None:
    """The runs' folders the watch keeps rings in without ``AUTOANNOT_RING``: a new run's
    folder, made by the first of its ranks, clears the runs beyond the newest
    ``run_folders.KEEP_RUNS`` whose processes are gone (a finished process's), keeps an old one
    whose process still runs (this one), and a run's second rank clears nothing; the newest is
    the one ``autoannot watch`` reads."""
    from autoannot.base import run_folders

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    import socket

    def old_run(name: str, pid: int, age_s: float) -> Path:
        folder = Path(run_folders.root()) / name
        folder.mkdir()
        names = folder / f"rank0{ring.NAMES_SUFFIX}"
        names.write_text(json.dumps({"ring": 1, "rank": 0, "pid": pid,
                                     "host": socket.gethostname()}) + "\n")
        when = time.time() - age_s
        os.utime(names, (when, when))
        os.utime(folder, (when, when))
        return folder

    first, _ = run_folders.make("first")  # (the user's folder, made by the first run)
    assert oct(Path(run_folders.root()).parent.stat().st_mode & 0o777) == "0o700"
    os.utime(first, (time.time() - 9000,) * 2)
    finished = [old_run(f"old{i:02d}", int(gone.stdout), 1000 - i) for i in range(12)]
    running = old_run("running", os.getpid(), 5000)  # (the oldest, its process alive)
    folder, made = run_folders.make("2026 06:01 run/x")
    assert made and Path(folder).name == "2026_06_01_run_x"
    kept = sorted(p.name for p in Path(run_folders.root()).iterdir())
    newest = sorted(p.name for p in finished[-(run_folders.KEEP_RUNS - 1):])
    assert kept == sorted([*newest, Path(folder).name, running.name]), kept
    assert run_folders.make("2026 06:01 run/x") == (folder, False)  # (its second rank)
    assert sorted(p.name for p in Path(run_folders.root()).iterdir()) == kept
    assert run_folders.newest() == folder and not Path(first).exists()


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
    from autoannot.live import tally as ring_tally

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
    from autoannot.live import publish

    one = ring.Ring(str(tmp_path / "alone"), 4)
    one.enter(new_record("all_reduce", {"Collective name": "allreduce"}, "here.py:1", {}))
    capfd.readouterr()
    began = time.monotonic()
    publish._publish(one, ("127.0.0.1", free_port()), 0.05)  # (returns: it ends)
    assert time.monotonic() - began < 6 * publish.TIMEOUT_S  # (torch's client retries)
    err = capfd.readouterr().err
    assert err.count("progress no longer published") == 1, err


def _watch_run(kind: str, monkeypatch, tmp_path: Path, capfd, **job_args: Any
               ) -> tuple[list[dict], list[tuple[float, str]]]:
    """The job ``kind`` watched by rank 0 (a look every 0.2 s): each rank's result, and each
    line the watch said with when (seconds from the job's start, read as it ran)."""
    rings = tmp_path / "rings"
    _watched(monkeypatch, rings)
    monkeypatch.setenv("AUTOANNOT_WATCH_INTERVAL", "0.2")
    results, said, _ = _said_while_it_runs(kind, tmp_path, capfd, **job_args)
    return results, said


def _said_while_it_runs(kind: str, tmp_path: Path, capfd, **job_args: Any
                        ) -> tuple[list[dict], list[tuple[float, str]], float]:
    """The job ``kind`` run (its environment set by the caller): each rank's result; each
    line rank 0's autoannot said (``autoannot``...) with when, in seconds from the job's start
    (read every 50 ms as it ran); and when it started (this host's monotonic clock)."""
    capfd.readouterr()
    worker, ran = _start(kind, tmp_path, record=None, **job_args)
    said: list[tuple[float, str]] = []
    pending = ""
    while True:
        alive = worker.is_alive()
        pending += capfd.readouterr().err
        *whole, pending = pending.split("\n")
        at = time.monotonic() - ran["began"]
        said += [(at, line.strip()) for line in whole if line.startswith("autoannot")]
        if not alive:
            break
        time.sleep(0.05)
    worker.join()
    assert "error" not in ran, ran.get("error")
    return ran["results"], said, ran["began"]


def _lines(said: list[tuple[float, str]], words: str) -> list[tuple[float, str]]:
    return [(at, line) for at, line in said if words in line]


def _waited_ms(line: str) -> float:
    """The others' wait a STRAGGLER line says (ms)."""
    value, unit = line.split("the others waiting ")[1].split(" for it")[0].split()
    return float(value) * (1e-3 if unit == "us" else 1.0)


def _noise_us(line: str) -> float:
    """The job's own noise a STRAGGLER line says (us)."""
    value, unit = line.split("the job's own noise ")[1].split(",")[0].split()
    return float(value) * (1e3 if unit == "ms" else 1.0)


def test_the_watch_as_a_user_turns_it_on(capfd, monkeypatch, tmp_path: Path) -> None:
    """``AUTOANNOT=1 AUTOANNOT_WATCH=1`` alone (no ring folder, the default look and stall), a
    400-step mesh job where rank 2 is 20 ms late before every all-reduce of its tp group {2, 3}:
    the rings are kept in the run's folder under the temporary folder, said once with the
    path; rank 2 is named within 10 s of the job's first collective, in group 2 (tp), by the
    plant (±25%),
    against a noise that is measured (more than 0), once; nothing else is said of a straggler
    or a hang; ``autoannot watch --once`` with no folder finds that run's rings (before: no ring
    and no watch, and no word of it)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("AUTOANNOT_WATCH", "1")
    monkeypatch.delenv("AUTOANNOT_RING", raising=False)
    results, said, began = _said_while_it_runs("late_tp", tmp_path, capfd, steps=400)
    kept = _lines(said, "AUTOANNOT_RING unset: the ranks' rings are kept in ")
    assert len(kept) == 1, said
    from autoannot.base import run_folders

    folder = Path(kept[0][1].split(" are kept in ")[1].split(" (this run's")[0])
    assert folder.parent == Path(run_folders.root()) and folder.is_relative_to(tmp_path)
    assert sorted(p.name for p in folder.glob(f"*{ring.SUFFIX}")) == [
        f"rank{r}{ring.SUFFIX}" for r in range(job.WORLD)]
    named = _lines(said, "STRAGGLER")
    assert len(named) == 1, said
    at, line = named[0]
    assert line.startswith(f"autoannot watch: STRAGGLER: rank {job.LATE_RANK} arrived last at "
                           "") and "of group 2 (tp)'s " in line, line
    # (from the job's first collective: its ranks' start-up, four processes importing torch on
    # this 2-core machine, takes 5-7 s before it; the watch can name no one before)
    first = min(_first_entry_s(folder, r) for r in range(job.WORLD)) - began
    assert at - first < 10.0, (at, first, line)
    assert abs(_waited_ms(line) - job.LATE_S * 1e3) <= 0.25 * job.LATE_S * 1e3, line
    assert _noise_us(line) > 0, line
    assert line.endswith(f"its call site {results[job.LATE_RANK]['sites']['tp']}"), line
    assert not _lines(said, "HANG") and not _lines(said, "no longer stands out"), said
    capfd.readouterr()
    assert cli.main(["watch", "--once"]) == 0
    out, err = capfd.readouterr()
    assert out.startswith(f"no hang: {job.WORLD} ranks' rings"), out
    assert f"the newest run's rings, {folder}" in err, err
    print(f"named {at - first:.1f} s after the job's first collective ({at:.1f} s after its "
          f"start): {line}")


def test_a_straggler_is_said_once_when_it_starts_and_once_when_it_ends(
        capfd, monkeypatch, tmp_path: Path) -> None:
    """Rank 2 20 ms late before its tp all-reduce in the first 200 of 800 steps, then on time:
    named once, by the plant, in its tp group alone; said once to no longer stand out, after
    the plant ended (before: named from the first 20 instances, against a noise of 0 us)."""
    _, said = _watch_run("late_tp", monkeypatch, tmp_path, capfd, steps=800,
                         late_steps=200)
    named, ended = _lines(said, "STRAGGLER"), _lines(said, "no longer stands out")
    assert len(named) == 1 and len(ended) == 1, said
    assert named[0][0] < ended[0][0], said
    assert f"STRAGGLER: rank {job.LATE_RANK} arrived last" in named[0][1]
    assert "of group 2 (tp)'s" in named[0][1]
    assert abs(_waited_ms(named[0][1]) - job.LATE_S * 1e3) <= 0.25 * job.LATE_S * 1e3, named
    first = int(named[0][1].split(" collectives #")[1].split("-#")[0])
    assert first < 200, named  # (the windows it was named by began while it was late)
    assert ended[0][1].startswith(f"autoannot watch: rank {job.LATE_RANK} no longer stands "
                                  "out in group 2 (tp)"), ended
    since = int(ended[0][1].split(" collectives #")[1].split("-#")[0])
    assert since >= 200, ended  # (on time from step 200: group 2's #200)
    assert len(said) == 2 + len(_lines(said, "AUTOANNOT")), said  # (no other line)


def test_a_blip_is_no_straggler(capfd, monkeypatch, tmp_path: Path) -> None:
    """Rank 1 20 ms late before its tp all-reduce in 20 steps in a row of 300, the rest on
    time: the rings show it last at each of those 20 by the plant, and no rank is named (20
    collectives of a fast job are a blip; before, it was named)."""
    _, said = _watch_run("blip", monkeypatch, tmp_path, capfd, steps=300)
    assert not _lines(said, "STRAGGLER"), said
    one = ring_files.read(tmp_path / "rings" / f"rank{job.BLIP_RANK}{ring.SUFFIX}")
    other = ring_files.read(tmp_path / "rings" / f"rank{1 - job.BLIP_RANK}{ring.SUFFIX}")

    def tp_entries(read: Any) -> dict[int, int]:
        kinds = {k for k, kind in read.kinds.items() if kind["group"] == "1"}
        mine = np.isin(read.records["kind"], list(kinds))
        return dict(zip(read.records["seq"][mine].tolist(),
                        read.records["entered_ns"][mine].tolist(), strict=True))

    late, early = tp_entries(one), tp_entries(other)
    blip = range(job.BLIP_FROM, job.BLIP_FROM + job.BLIP_STEPS)
    assert all(late[s] - early[s] >= 0.75 * job.LATE_S * 1e9 for s in blip)  # (the plant)


def test_a_rank_late_every_step_is_named_once_by_its_plant(capfd, monkeypatch,
                                                           tmp_path: Path) -> None:
    """Rank 2 sleeps 20 ms before each step's broadcast (200 steps): rank 0's watcher names it,
    and no other rank, at the broadcast's call site, late by the plant, once; rank 0, held in
    that broadcast and so last at its next tp all-reduce, is not named. So does the straggler
    rule on the store's progress documents where rank 2 is on a second host (its clock
    37 ms off), from its time outside collectives."""
    results, said = _watch_run("late", monkeypatch, tmp_path, capfd)
    named = _lines(said, "STRAGGLER")
    assert len(named) == 1, said
    line = named[0][1]
    assert line.startswith(f"autoannot watch: STRAGGLER: rank {job.LATE_RANK} arrived last "), line
    assert "of group 0 (default_pg)'s " in line, line
    assert line.endswith(f"its call site {results[job.LATE_RANK]['sites']['broadcast']}"), line
    assert abs(_waited_ms(line) - job.LATE_S * 1e3) <= 0.25 * job.LATE_S * 1e3, line
    lead = _offline_lead(capfd, tmp_path / "rings")  # (and the offline lead says so too)
    assert lead.startswith(f"rank {job.LATE_RANK} held the others up most"), lead
    found = _across_hosts(tmp_path / "rings", job.LATE_RANK, -CLOCK_OFFSET_US)
    assert [(s.rank, s.group, s.by_time_outside) for s in found] == [
        (job.LATE_RANK, "0", True)], found
    assert abs(found[0].late_by_us - job.LATE_S * 1e6) <= 0.25 * job.LATE_S * 1e6, found


#: A planted offset between two hosts' monotonic clocks (us).
CLOCK_OFFSET_US = 37_000.0


def _across_hosts(rings: Path, moved: int, offset_us: float) -> list[Any]:
    """The stragglers as a watcher of the store would name them (the ranks' progress
    documents, made from the job's real rings, each with its ring's last ``watch.TAIL``
    launches), where rank ``moved`` ran on a second host whose monotonic clock reads
    ``offset_us`` more than the first's (a planted offset)."""
    from autoannot.live import progress as rank_progress
    from autoannot.live import watch
    from autoannot.traces.analysis import stragglers

    documents = []
    for path in ring_files.in_folder(rings):
        one = ring_files.read(path, watch.TAIL)
        document = rank_progress.decode(rank_progress.encode(
            rank_progress.of_ring(one, watch.TAIL)))
        assert document is not None and document["host"] == one.meta["host"]
        if document["rank"] == moved:
            document["host"] = f"{document['host']}-second"
            document["base_us"] += int(offset_us)
        documents.append(document)
    tails = rank_progress.tails_of(documents)
    return stragglers.persistent(tails.entered, tails.members, tails.gaps, tails.clocks)


def _offline_lead(capfd, rings: Path) -> str:
    """``autoannot skew``'s first line on a job's rings."""
    capfd.readouterr()
    assert cli.main(["skew", "-q", "--json", str(rings)]) == 0
    return json.loads(capfd.readouterr().out)["lead"][0]


def test_a_job_with_nothing_planted_names_no_straggler(capfd, monkeypatch,
                                                        tmp_path: Path) -> None:
    """300 steps, nothing planted: the watcher names no rank and says no hang, and neither
    does the offline lead on the same rings."""
    _, said = _watch_run("steady", monkeypatch, tmp_path, capfd, steps=300)
    assert not _lines(said, "STRAGGLER") and not _lines(said, "HANG"), said
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
        for group, desc, collective in (("0", "default_pg", "broadcast"),
                                        (str(1 + rank // 2), "tp", "allreduce"),
                                        (str(3 + rank % 2), "dp", "allreduce")):
            key = ("autoannot_collectives_total", (("collective", collective), ("group", group),
                                                   ("group_desc", desc), ("rank", str(rank))))
            assert got.get(key) == job.LONG_STEPS, (key, got.get(key))
        assert got[("autoannot_collective_seconds_total", (
            ("group", "0"), ("group_desc", "default_pg"), ("rank", str(rank))))] > 0
    late = {k: v for k, v in got.items() if k[0] == "autoannot_straggler_wait_seconds"}
    assert list(late) == [("autoannot_straggler_wait_seconds", (
        ("group", "0"), ("group_desc", "default_pg"), ("rank", str(job.LATE_RANK))))], late
    assert abs(next(iter(late.values())) - job.LATE_S) <= 0.25 * job.LATE_S
    assert got[("autoannot_hang_culprit_rank", ())] == -1


def test_the_metrics_of_a_late_job_are_its_launches_its_time_and_its_straggler(
        capsys, monkeypatch, tmp_path: Path) -> None:
    """The late job's rings, watched once with metrics served: every rank's launches of each
    group as the job made them, time in collectives, rank 2's straggler wait (the plant)
    alone, no hang."""
    from harness import free_port

    from autoannot.live.metrics import JobMetrics
    from autoannot.live.watch import Watcher

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
    watcher in the job): a watcher of that store, looking while the job runs, names rank 2 a
    straggler (the plant) alone, from the few launches each document carries; once the job is
    done it serves every rank's launches of each group as the job made them (the ranks' own
    totals, complete: published once more at exit), time in collectives, and rank 2's
    straggler wait."""
    from datetime import timedelta

    import torch.distributed as dist
    from harness import RUN_EXIT_FUNCTIONS, free_port

    from autoannot.live.metrics import JobMetrics
    from autoannot.live.publish import connect
    from autoannot.live.watch import StoreProgress, Watcher

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    monkeypatch.setenv("AUTOANNOT_RING", str(tmp_path / "rings"))
    monkeypatch.setenv("AUTOANNOT_WATCH_STORE", f"127.0.0.1:{port}")
    monkeypatch.setenv("AUTOANNOT_WATCH_INTERVAL", "0.2")
    monkeypatch.setenv(RUN_EXIT_FUNCTIONS, "1")  # (the ranks exit as a job's do)
    metrics = JobMetrics()
    served = metrics.serve(metrics_port := free_port(), "127.0.0.1")
    said: list[str] = []
    try:
        watcher = Watcher(StoreProgress(connect(("127.0.0.1", port)), f"127.0.0.1:{port}"),
                          STALL_S, said.append, metrics=metrics)
        stop = threading.Event()
        looking = threading.Thread(target=watcher.run, args=(0.2, stop))
        looking.start()
        try:
            job.run("late", tmp_path, TIMEOUT_S)
        finally:
            stop.set()
            looking.join(30)
        watcher.look()  # (the job done: the totals it published at its exit read, metered)
        watcher.look()
        got = _scrape(metrics_port)
    finally:
        if isinstance(served, tuple):
            served[0].shutdown()
        del server
    named = [line for line in said if "STRAGGLER" in line]
    assert len(named) == 1 and f"STRAGGLER: rank {job.LATE_RANK} " in named[0], said
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

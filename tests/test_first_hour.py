"""Issue 46: what a new user gives the tools in their first hour, on real 4-rank gloo jobs
(``user_jobs.py``: rank 2 sleeps before step 3's broadcast). Each answer is the plant's (rank,
call site, delay) or a clear refusal (exit 2, what to do), never a traceback or a wrong lead."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import user_jobs as job

from autoannot import cli

DELAY_US = job.DELAY_S * 1e6
COMMANDS = ("skew", "report", "check", "summary")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, tuple[Path, list[dict]]]:
    made = {}
    for kind, record in (("shared", "one/all.jsonl"), ("unscheduled", "rank{rank}.jsonl"),
                         ("unrecorded", None)):
        out = tmp_path_factory.mktemp(kind)
        made[kind] = (out, job.run(kind, out, record))
    return made


def _run(capsys, command: str, *inputs: str, extra: tuple[str, ...] = ()
         ) -> tuple[int, str, str]:
    """``autoannot COMMAND`` as a user runs it (``report`` writes a page beside the inputs'
    folder); exit code, stdout, stderr."""
    argv = [command, *inputs, *extra]
    if command == "report":
        page = Path(inputs[0]).parent / f"page-{os.getpid()}-{time.monotonic_ns()}.html"
        argv += ["-q", "-o", str(page)]
    elif command in ("skew", "summary"):
        argv.append("-q")
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _planted_lead(said: dict, site: str) -> None:
    """The lead is the plant: rank 2 at its broadcast, late by the delay (within 25%: a busy
    machine's noise)."""
    top = said["origins"][0]
    assert (top["rank"], top["call_site"]) == (job.PLANTED_RANK, site), top
    assert abs(top["late_us"] - DELAY_US) <= 0.25 * DELAY_US, top
    assert said["lead"][0].startswith(f"rank {job.PLANTED_RANK} held the others up most"), said


def _skew_json(capsys, *inputs: str) -> tuple[int, dict]:
    code = cli.main(["skew", "-q", "--json", *inputs])
    return code, json.loads(capsys.readouterr().out)


# --- a record path without {rank} ------------------------------------------------------------

def test_a_record_path_without_rank_is_each_ranks_own_file(jobs) -> None:
    out, _ = jobs["shared"]
    assert sorted(p.name for p in (out / "one").iterdir()) == [
        f"all.rank{r}.jsonl" for r in range(job.WORLD)]
    for rank in range(job.WORLD):
        lines = (out / "one" / f"all.rank{rank}.jsonl").read_text().splitlines()
        assert {json.loads(line)["rank"] for line in lines} == {rank}


def test_the_per_rank_path_is_said_once_by_rank_0(tmp_path: Path) -> None:
    from test_record_file import run_job  # (a fake 2-rank group: this process is rank 0)

    done = run_job(tmp_path, str(tmp_path / "r.jsonl"))
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "would be one file" in line]
    assert len(said) == 1 and "r.rank{rank}.jsonl" in said[0], done.stderr
    assert not (tmp_path / "r.jsonl").exists() and (tmp_path / "r.rank0.jsonl").is_file()


@pytest.mark.parametrize("given", ["job folder", "record folder", "one file of every rank"])
def test_every_tool_is_right_on_a_shared_record(jobs, capsys, tmp_path: Path, given) -> None:
    """The job's own folder; its per-rank record files; and those files put together in one
    (``cat rank*.jsonl > all.jsonl``, or written by an older autoannot): read rank by rank."""
    out, results = jobs["shared"]
    site = results[job.PLANTED_RANK]["sites"]["broadcast"]
    if given == "job folder":
        inputs = [str(out)]
    elif given == "record folder":
        inputs = [str(out / "one")]
    else:
        together = tmp_path / "all.jsonl"
        together.write_text("".join(p.read_text() for p in sorted((out / "one").iterdir())))
        inputs = [str(together)]
    code, said = _skew_json(capsys, *inputs)
    assert code == 0, said["problems"]
    _planted_lead(said, site)
    assert not said["missing"]
    code, text, err = _run(capsys, "check", *inputs)
    assert code == 0 and "MISSING" not in text, (text, err)
    assert f"across {job.WORLD} ranks: 0 diverge" in text
    code, text, err = _run(capsys, "report", *inputs)
    assert code == 0, err
    assert f"rank {job.PLANTED_RANK} held the others up most" in text
    code, text, err = _run(capsys, "summary", *inputs)
    assert code == 0 and "Traceback" not in err


def test_rows_holding_one_place_twice_are_refused_not_a_crash(jobs, capsys,
                                                              tmp_path: Path) -> None:
    """Rows a job made while its ranks shared one record file (an older autoannot): one rank's
    rows hold group 0 #k twice. Refused, naming the file, where the matcher crashed before."""
    from autoannot.traces.table import rows

    out, _ = jobs["unscheduled"]
    folder = tmp_path / "doubled"
    folder.mkdir()
    for path in out.glob("trace_rank?.rows.parquet"):
        shutil.copy(path, folder / path.name)
    bad = folder / "trace_rank1.rows.parquet"
    one = rows.read(bad)
    seq = one.columns["seq"].copy()
    seq[1] = seq[0]  # two launches at one place of the group's sequence
    one.columns["seq"] = seq
    bad.unlink()
    rows.write_parquet(one, bad)
    for command in ("skew", "report"):
        code, _, err = _run(capsys, command, str(folder))
        assert code == 2, err
        assert "trace_rank1.rows.parquet" in err and "more than once" in err, err


# --- a profile without a schedule ------------------------------------------------------------

def test_an_unscheduled_profile_leads_with_the_planted_delay(jobs, capsys) -> None:
    """Each rank starts its profiler 0.15 s after the one before (rank 3: 0.45 s after rank
    0, more than the planted 0.2 s); torch writes no steps. The plant leads; the missing steps
    are said."""
    out, results = jobs["unscheduled"]
    site = results[job.PLANTED_RANK]["sites"]["broadcast"]
    traces = sorted(map(str, out.glob("trace_rank?.json")))
    records = sorted(map(str, out.glob("rank?.jsonl")))
    for inputs in ([str(out)], traces + records):
        code, said = _skew_json(capsys, *inputs)
        assert code == 0, said["problems"]
        _planted_lead(said, site)
        assert any(n.startswith("no profiler steps in these traces") for n in said["notes"])
        assert all(i["step"] == -1 for i in said["instances"])  # (truly none)
        started = [i for i in said["instances"] if i["group"] == "0" and i["seq"] == 2]
        assert started and started[0]["warmup"]  # the first collective each rank profiled
    code, text, _ = _run(capsys, "report", str(out))
    assert code == 0 and f"rank {job.PLANTED_RANK} held the others up most" in text


# --- record files of one run beside rows of another ------------------------------------------

def test_two_runs_in_one_folder_get_one_refusal_from_every_command(jobs, capsys,
                                                                   tmp_path: Path) -> None:
    """Run A's record files (the unscheduled job's) beside run B's traces and rows (the shared
    job's): every command refuses, naming both runs; --run picks one."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    b, results = jobs["shared"]
    for path in b.glob("trace_rank?.*"):
        shutil.copy(path, folder / path.name)
    a, _ = jobs["unscheduled"]
    for path in a.glob("rank?.jsonl"):
        shutil.copy(path, folder / path.name)
    run_a = json.loads((a / "rank0.jsonl").read_text().splitlines()[0])["run"]
    run_b = json.loads((b / "one" / "all.rank0.jsonl").read_text().splitlines()[0])["run"]
    assert run_a != run_b
    for command in COMMANDS:
        code, _, err = _run(capsys, command, str(folder))
        assert code == 2, (command, err)
        assert run_a in err and run_b in err and "--run" in err, (command, err)
        assert "Traceback" not in err
    code, said = _skew_json(capsys, str(folder), "--run", run_b)
    assert code == 0
    _planted_lead(said, results[job.PLANTED_RANK]["sites"]["broadcast"])
    assert not any("stand for" in n for n in said["notes"])  # (no file of run A stands in)


# --- gloo traces without AUTOANNOT_RECORD ----------------------------------------------------

def test_gloo_traces_of_the_agent_alone_become_rows_and_alone_are_refused(jobs, capsys,
                                                                          tmp_path: Path) -> None:
    """Issue 50: a job with ``AUTOANNOT=1`` alone (no record file, no ring): the rows written
    beside its gloo traces at export are named by the launches the agent held in each
    profiler window, and ``skew`` on them leads with the plant, at its call site (before:
    no rows were written). The traces copied alone (no rows) are refused, naming what to run
    with."""
    out, results = jobs["unrecorded"]
    assert not list(out.glob("*.jsonl"))
    assert len(list(out.glob("trace_rank?.rows*"))) == 4
    code, said = _skew_json(capsys, str(out))
    assert code == 0, said["problems"]
    _planted_lead(said, results[job.PLANTED_RANK]["sites"]["broadcast"])
    alone = tmp_path / "traces"
    alone.mkdir()
    for path in out.glob("trace_rank?.json"):
        shutil.copy(path, alone / path.name)
    for command in ("skew", "report", "check"):
        code, text, err = _run(capsys, command, str(alone))
        assert code == 2, (command, err)
        said_lines = err.strip().splitlines()
        assert len(said_lines) == 1 and "AUTOANNOT=1" in said_lines[0], (command, err)
        assert "AUTOANNOT_RECORD" in said_lines[0], (command, err)
        assert "collective instances" not in text and not text.strip(), (command, text)


# --- Ctrl-C during report --------------------------------------------------------------------

def _write_rows(folder: Path, ranks: int, instances: int) -> Path:
    spec = importlib.util.spec_from_file_location(
        "report_scale", Path(__file__).parent.parent / "benchmarks" / "report_scale.py")
    assert spec is not None and spec.loader is not None
    scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scale)
    folder.mkdir()
    scale.write_rows(folder, ranks, instances)
    return folder


LEFT_BY_ITS_TIMER = """
import multiprocessing
import time

from autoannot.traces import parallel

if __name__ == "__main__":
    parallel.LEAVE_AFTER_INTERRUPT_S = 0.2  # (as the command sets it, shorter)
    with parallel.pool(2, multiprocessing.get_context("forkserver")) as workers:
        print(workers.submit(abs, -1).result(), flush=True)
        parallel.leave_after_interrupt()
        time.sleep(30)  # (an exit that waits: the timer ends it)
"""


def test_a_command_its_leave_timer_ends_prints_nothing_of_its_pool(tmp_path: Path) -> None:
    """A command ended by its leave timer (its pool not shut down) prints nothing more: no
    warning of the pool's semaphores from multiprocessing's resource tracker (CI saw one,
    after the interrupted line, about one run in 40)."""
    script = tmp_path / "left.py"
    script.write_text(LEFT_BY_ITS_TIMER)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (130, "1\n", "")


def test_a_ctrl_c_as_the_command_ends_leaves_no_traceback(monkeypatch) -> None:
    """A Ctrl-C that reached ``report`` as it had finished — while it put in the handler that
    ignores Ctrl-C for Python's exit — raised there: a traceback, and the process killed by
    the signal (-2) with its page whole (seen once in ~20 interrupted runs of the test below).
    The command now ends with its own status. The signal's arrival inside ``signal.signal`` is
    stood in for by its effect there, a ``KeyboardInterrupt`` (a race no real signal hits on
    demand)."""
    from autoannot.traces import parallel

    calls: list[object] = []
    real = signal.signal

    def interrupted_once(signum: int, handler: object) -> object:
        calls.append(handler)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(signum, signal.getsignal(signum))  # (this test's process: as it was)

    monkeypatch.setattr(cli, "main", lambda argv=None: 0)
    monkeypatch.setattr(cli, "_ENDS_THE_PROCESS", False)  # (run() sets it: put back after)
    monkeypatch.setattr(cli.signal, "signal", interrupted_once)
    monkeypatch.setattr(parallel, "prepare_workers", lambda: None)
    monkeypatch.setattr(parallel, "LEAVE_AFTER_INTERRUPT_S", None)  # (run() sets it)
    with pytest.raises(SystemExit) as ended:
        cli.run()
    assert ended.value.code == 0
    assert calls == [signal.SIG_IGN, signal.SIG_IGN]  # (put in again after the interrupt)


def test_a_ctrl_c_during_an_import_ends_as_interrupted_with_no_traceback(monkeypatch,
                                                                       capsys) -> None:
    """A Ctrl-C that reached ``report`` while an import was making a class (a ``__set_name__``
    call, which Python 3.11 wraps in a RuntimeError) ended it with a traceback and status 1
    (seen once in the interrupted runs of the test below, in an import of narwhals'). An error
    an interrupt raised is an interrupt: status 130, no traceback. The signal's arrival there is
    stood in for by its effect, a ``KeyboardInterrupt`` raised by ``__set_name__``."""

    class InterruptedHere:
        def __set_name__(self, owner: type, name: str) -> None:
            raise KeyboardInterrupt

    def command(args: object) -> int:
        class Frame:  # (what a module being imported makes)
            implementation = InterruptedHere()

        return 0

    monkeypatch.setattr(cli, "_run_command", command)
    assert cli.main(["report", "-q", "rows", "-o", "page.html"]) == cli.INTERRUPTED
    err = capsys.readouterr().err
    assert "Traceback" not in err and "interrupted" in err


def test_a_ctrl_c_as_a_temporary_file_is_made_leaves_none(tmp_path: Path, monkeypatch) -> None:
    """A Ctrl-C that came after a temporary file was made and before its maker knew its name
    left ``.autoannot-*.tmp`` beside the outputs of a command that said it left nothing (seen
    once in the interrupted runs of the test below). The interrupted command now removes what
    this process left. The Ctrl-C's arrival right there is stood in for by its effect, a
    ``KeyboardInterrupt`` as ``os.open`` returns."""
    from autoannot.traces import files

    real_open = os.open

    def interrupted(path: str, flags: int, mode: int = 0o777) -> int:
        os.close(real_open(path, flags, mode))
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(files.os, "open", interrupted)
        with pytest.raises(KeyboardInterrupt):
            files.atomic_write_bytes(tmp_path / "page.html", b"<html></html>")
    assert [p.name.startswith(".autoannot-") for p in tmp_path.iterdir()] == [True]
    files.remove_temporary_files()
    assert list(tmp_path.iterdir()) == []


INTERRUPTED_AS_ITS_PAGE_IS_PUT_IN_PLACE = """
import os
import signal
import sys

from autoannot import cli
from autoannot.traces import outputs

remember = outputs.remember


def interrupted(paths, command):  # (the page renamed into place; the terminal's Ctrl-C now)
    os.kill(os.getpid(), signal.SIGINT)
    remember(paths, command)


outputs.remember = interrupted
sys.argv = ["autoannot", *sys.argv[1:]]
cli.run()
"""


def test_a_ctrl_c_as_the_outputs_are_put_in_place_leaves_them_and_the_commands_status(
        tmp_path: Path) -> None:
    """A Ctrl-C that came once ``report``'s page was renamed into place ended it as
    "interrupted (nothing half-written is left)", status 130, beside the whole page and its
    listing (seen once in CI, in the interrupted runs of the test below). A Ctrl-C is now held
    from the outputs' renaming to the command's end: it ends with its own status, its page in
    place, and says so. The signal is sent by the process to itself right there."""
    rows = _write_rows(tmp_path / "rows", 2, 20)
    page = tmp_path / "out" / "page.html"
    alone = subprocess.run(
        [sys.executable, "-m", "autoannot", "report", "-q", str(rows), "-o",
         str(tmp_path / "alone.html")], capture_output=True, text=True, timeout=120)
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_AS_ITS_PAGE_IS_PUT_IN_PLACE, "report", "-q",
         str(rows), "-o", str(page)], capture_output=True, text=True, timeout=120)
    assert alone.returncode in (0, 1) and done.returncode == alone.returncode, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "autoannot report: the Ctrl-C came once the outputs were being put in place: they are "
        "whole, and the command ended")
    assert page.read_text(encoding="utf-8").rstrip().endswith("</html>")
    assert f"{page}: " in done.stdout  # (what it says of its page, after the Ctrl-C)


def test_ctrl_c_during_report_leaves_no_traceback_no_file_no_process(tmp_path: Path) -> None:
    """The terminal's Ctrl-C reaches every process of the command (its pool's workers and
    forkserver too): 20 runs, each interrupted while its workers run, at a random moment."""
    import psutil

    rows = _write_rows(tmp_path / "rows", 128, 8000)
    out = tmp_path / "out"
    out.mkdir()
    interrupted = 0
    for run in range(20):
        page = out / "page.html"
        p = subprocess.Popen(
            [sys.executable, "-m", "autoannot", "report", "-j", "2", "--partition-launches",
             "50000", str(rows), "-o", str(page)], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True)
        command = psutil.Process(p.pid)
        while p.poll() is None and not command.children(recursive=True):
            time.sleep(0.002)
        time.sleep(random.uniform(0.0, 0.5))
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)  # what the terminal does
            interrupted += 1
        try:
            _, err = p.communicate(timeout=60)  # (a worker left behind holds stderr open)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            raise AssertionError(f"run {run}: a process of the command was left running") from None
        if p.returncode == 0:  # (done before the Ctrl-C: its page, and the list of what
            for written in out.iterdir():  # autoannot wrote there, go before the next run)
                written.unlink()
            continue
        assert p.returncode == 130, (run, err)
        assert "Traceback" not in err and "Error" not in err, (run, err)
        said = err.strip().splitlines()  # (a pass done before the Ctrl-C says its line)
        assert said[-1:] == ["autoannot report: interrupted (nothing half-written is left)"] \
            and all(re.fullmatch(r"autoannot: \w[\w ]*: \d+ tasks in .*", line)
                    for line in said[:-1]), (run, err)
        assert list(out.iterdir()) == [], run
    assert interrupted >= 15

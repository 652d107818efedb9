"""``AUTOANNOT_RECORD``'s file: one JSON line per launch, written before the launch runs, from
any thread, whatever ends the job; never at the expense of the in-memory recorders."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from harness import clean_env, free_port

FAKE_JOB = textwrap.dedent("""
    import sys, threading
    import torch, torch.distributed as dist
    import autoannot
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    threads = int(sys.argv[1])
    with autoannot.record() as records:
        def work():
            for _ in range(int(sys.argv[2])):
                dist.all_reduce(torch.ones(4))
                dist.all_gather_into_tensor(torch.empty(8), torch.ones(4))
        workers = [threading.Thread(target=work) for _ in range(threads)]
        [w.start() for w in workers]
        [w.join() for w in workers]
    print(len(records))
""")


def run_job(tmp_path: Path, record: str, threads: int = 1, calls: int = 2
            ) -> subprocess.CompletedProcess:
    (tmp_path / "job.py").write_text(FAKE_JOB)
    env = clean_env()
    env.update(AUTOANNOT="1", AUTOANNOT_RECORD=record)
    return subprocess.run([sys.executable, "job.py", str(threads), str(calls)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)


def test_each_line_names_rank_process_time_group_and_sequence(tmp_path: Path) -> None:
    done = run_job(tmp_path, str(tmp_path / "rank{rank}-{host}.jsonl"))
    assert done.returncode == 0, done.stderr
    (path,) = tmp_path.glob("rank0-*.jsonl")
    assert path.name == f"rank0-{os.uname().nodename}.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [x["api"] for x in lines] == ["all_reduce", "all_gather_into_tensor"] * 2
    pid = lines[0]["pid"]
    assert {(x["rank"], x["pid"], x["group"]) for x in lines} == {(0, pid, "0")}
    assert [x["seq"] for x in lines] == [0, 1, 2, 3]
    times = [x["monotonic_ns"] for x in lines]
    assert times == sorted(times) and times[0] < time.monotonic_ns()
    assert lines[0]["annotation"]["Collective name"] == "allreduce"
    assert lines[1]["param_comms"]["Collective name"] == "_allgather_base"
    assert lines[0]["call_site"].endswith("job.py:11")
    assert done.stdout.split() == ["4"]  # the in-memory recorder saw them too


def test_threads_write_whole_lines_in_sequence(tmp_path: Path) -> None:
    done = run_job(tmp_path, str(tmp_path / "r{rank}.jsonl"), threads=4, calls=100)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (tmp_path / "r0.jsonl").read_text().splitlines()]
    assert len(lines) == 800
    assert [x["seq"] for x in lines] == list(range(800))  # file order is sequence order
    assert done.stdout.split() == ["800"]


@pytest.mark.parametrize("bad", ["/etc/hostname/x.jsonl", "{host", "r{node}.jsonl", "dir/"])
def test_a_bad_path_costs_the_job_nothing_but_its_file(tmp_path: Path, bad: str) -> None:
    """The collectives run, the in-memory recorder gets every record; one message says why
    there is no file; nothing is created for it."""
    before = sorted(p.name for p in tmp_path.iterdir())
    done = run_job(tmp_path, bad, calls=3)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["6"]
    said = [line for line in done.stderr.splitlines() if "AUTOANNOT_RECORD" in line]
    assert len(said) == 1, done.stderr
    assert "KeyError" not in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "job.py"])


def test_a_missing_folder_is_created_and_said(tmp_path: Path) -> None:
    done = run_job(tmp_path, str(tmp_path / "records" / "r{rank}.jsonl"))
    assert done.returncode == 0, done.stderr
    assert len((tmp_path / "records" / "r0.jsonl").read_text().splitlines()) == 4
    assert f"created {tmp_path / 'records'}" in done.stderr


HANGING_RANKS = textwrap.dedent("""
    import os, sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    if dist.get_rank() == 1:
        time.sleep(600)  # never joins the next collective
    dist.all_gather_into_tensor(torch.empty(8), t)  # rank 0 hangs here
""")


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_the_collective_that_hangs_is_in_the_file(tmp_path: Path, how: signal.Signals) -> None:
    """Two gloo ranks, one never joins the third collective; the job is killed as torchrun
    kills a stuck one: rank 0's file ends with the collective it hangs in."""
    (tmp_path / "job.py").write_text(HANGING_RANKS)
    port = str(free_port())
    env = clean_env()
    env.update(AUTOANNOT="1", AUTOANNOT_RECORD=str(tmp_path / "r{rank}.jsonl"),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2")
    ranks = [subprocess.Popen([sys.executable, "job.py"], env={**env, "RANK": str(rank)},
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for rank in (0, 1)]
    try:
        deadline = time.monotonic() + 120
        expected = ["all_reduce", "broadcast", "all_gather_into_tensor"]
        while time.monotonic() < deadline:
            path = tmp_path / "r0.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            if len(lines) >= 3 or any(r.poll() is not None for r in ranks):
                break
            time.sleep(0.2)
        time.sleep(0.5)  # rank 0 is inside the all-gather, waiting for rank 1
        assert ranks[0].poll() is None, ranks[0].stderr.read().decode()[-2000:]
    finally:
        for r in ranks:
            r.send_signal(how)
        for r in ranks:
            r.wait(timeout=60)
    rank0 = [json.loads(x) for x in (tmp_path / "r0.jsonl").read_text().splitlines()]
    rank1 = [json.loads(x) for x in (tmp_path / "r1.jsonl").read_text().splitlines()]
    assert [x["api"] for x in rank0] == expected
    assert [x["api"] for x in rank1] == expected[:2]
    assert rank0[2]["seq"] == 2 and rank0[2]["rank"] == 0


TWO_RANK_JOB = textwrap.dedent("""
    import sys, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    size = int(sys.argv[1])
    for step in range(3):
        if dist.get_rank() == 1 and step == 1:
            time.sleep(0.05)
        dist.all_reduce(torch.ones(size))
        dist.broadcast(torch.ones(4), src=0)
    dist.destroy_process_group()
""")


def _two_ranks(tmp_path: Path, record: str, size: int) -> None:
    (tmp_path / "job2.py").write_text(TWO_RANK_JOB)
    env = clean_env()
    env.update(AUTOANNOT="1", AUTOANNOT_RECORD=record, MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    ranks = [subprocess.Popen([sys.executable, "job2.py", str(size)],
                              env={**env, "RANK": str(rank)}, cwd=tmp_path,
                              stderr=subprocess.PIPE) for rank in (0, 1)]
    for r in ranks:
        assert r.wait(timeout=240) == 0, r.stderr.read().decode()[-2000:]


def test_two_runs_into_one_template_are_never_mixed(tmp_path: Path, capsys) -> None:
    """A 2-rank gloo job run twice with the same AUTOANNOT_RECORD (the second run's all-reduce
    twice the size): each line names its run, the same on both ranks; check and skew refuse
    to line one run up against the other, name both, and line up either one when asked.
    """
    from autoannot import cli

    record = str(tmp_path / "rank{rank}.jsonl")
    _two_ranks(tmp_path, record, 8)
    _two_ranks(tmp_path, record, 16)
    files = [tmp_path / "rank0.jsonl", tmp_path / "rank1.jsonl"]
    lines = [[json.loads(x) for x in f.read_text().splitlines()] for f in files]
    runs = [list(dict.fromkeys(x["run"] for x in rank)) for rank in lines]
    assert len(runs[0]) == 2 and runs[0] == runs[1]  # two runs, agreed on by both ranks
    assert all(isinstance(x["wall_ns"], int) for rank in lines for x in rank)
    assert cli.main(["check", *map(str, files)]) == 2  # (as skew: one run at a time)
    said = capsys.readouterr().err
    assert runs[0][0] in said and runs[0][1] in said and "--run" in said
    for run in runs[0]:
        assert cli.main(["check", "--run", run, *map(str, files)]) == 0
        assert "0 diverge" in capsys.readouterr().out
    assert cli.main(["skew", "-q", *map(str, files)]) == 2
    said = capsys.readouterr().err
    assert runs[0][0] in said and runs[0][1] in said and "--run" in said
    for run in runs[0]:
        assert cli.main(["skew", "-q", "--json", "--run", run, *map(str, files)]) == 0
        report = json.loads(capsys.readouterr().out)
        assert len(report["instances"]) == 6  # one run's: 3 steps x 2 collectives
    # summary reads record files (gloo's sizes, groups, counts), one run at a time too
    assert cli.main(["summary", "-q", *map(str, files)]) == 2
    assert runs[0][1] in capsys.readouterr().err
    for run, size in zip(runs[0], (8, 16), strict=True):
        assert cli.main(["summary", "-q", "--json", "--run", run, *map(str, files)]) == 0
        rows = json.loads(capsys.readouterr().out)["record_rows"]
        by_name = {r["collective"]: r for r in rows}
        assert by_name["allreduce"]["size_bytes"] == 4 * size  # float32
        assert by_name["allreduce"]["count_max"] == by_name["broadcast"]["count_min"] == 3
        assert {r["ranks"] for r in rows} == {2}
    # rank 0's first run against rank 1's second: refused, both named
    only = tmp_path / "split"
    only.mkdir()
    (only / "rank0.jsonl").write_text("".join(
        json.dumps(x) + "\n" for x in lines[0] if x["run"] == runs[0][0]))
    (only / "rank1.jsonl").write_text("".join(
        json.dumps(x) + "\n" for x in lines[1] if x["run"] == runs[0][1]))
    assert cli.main(["skew", "-q", str(only / "rank0.jsonl"), str(only / "rank1.jsonl")]) == 2
    said = capsys.readouterr().err
    assert runs[0][0] in said and runs[0][1] in said

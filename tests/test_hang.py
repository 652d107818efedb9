"""A hang's culprit, on real 4-rank gloo jobs hung at a known rank and collective
(``hang_jobs``): ``skew``, ``check`` and ``report`` lead with it, exit 1, and say every
other rank as blocked on it, where. A mismatch is said as a mismatch. Planted truth only:
the answers come from the jobs' plants and their call sites, never from the tools."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import hang_jobs as job
import numpy as np
import pytest
import torch

from autoannot import cli
from autoannot.traces.analysis import hang
from autoannot.traces.table import rows

#: Whether this torch's Flight Recorder dumps a gloo group's ring (torch 2.6's dumps NCCL's
#: alone: ``_dump_nccl_trace``).
FR_DUMPS = hasattr(torch._C._distributed_c10d, "_dump_fr_trace")
NO_FR_DUMPS = ("this torch's Flight Recorder dumps no gloo group's ring (torch._C."
               "_distributed_c10d has no _dump_fr_trace)")


@pytest.fixture(scope="module")
def hung(tmp_path_factory) -> dict[str, tuple[Path, list[dict[str, Any]]]]:
    """Each job's folder (record files, and torch's Flight Recorder dumps where this torch
    dumps gloo's: each rank dumps its ring as it ends, as a rank does after its timeout) and
    its ranks' results; ``KIND-fr``: a folder of the dumps alone (a job that ran without
    autoannot); ``KIND-records``: of the record files alone."""
    made = {}
    saved = os.environ.get("TORCH_FR_BUFFER_SIZE")
    if FR_DUMPS:
        os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    try:
        for kind, timeout in (("mesh", 20), ("mismatch", 5), ("two", 20)):
            out = tmp_path_factory.mktemp(kind)
            made[kind] = (out, job.run(kind, out, timeout))
            for way, pattern in (("-fr", f"{job.FR_PREFIX}*"), ("-records", "*.jsonl")):
                if way == "-fr" and not FR_DUMPS:
                    continue
                alone = tmp_path_factory.mktemp(kind + way)
                for path in out.glob(pattern):
                    shutil.copy(path, alone / path.name)
                assert len(list(alone.iterdir())) == job.WORLD
                made[kind + way] = (alone, made[kind][1])
    finally:
        if saved is None:
            os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
        else:
            os.environ["TORCH_FR_BUFFER_SIZE"] = saved
    return made


def _given(hung: dict[str, Any], kind: str, way: str) -> tuple[Path, list[dict[str, Any]]]:
    """A job's inputs one way in; skipped where they are dumps this torch cannot make."""
    if way == "-fr" and not FR_DUMPS:
        pytest.skip(NO_FR_DUMPS)
    return hung[kind + way]


#: Each job's inputs: autoannot's record files and torch's dumps together, the dumps alone,
#: the record files alone.
WAYS_IN = ("", "-fr", "-records")


def _said(capsys, command: str, *args: str) -> tuple[int, list[str]]:
    code = cli.main([command, *args])
    return code, capsys.readouterr().out.splitlines()


def _lead(capsys, tmp_path: Path, folder: Path) -> dict[str, tuple[int, list[str]]]:
    """Each command's exit and its lead lines (the page's lead, for ``report``)."""
    found = {name: _said(capsys, name, str(folder)) for name in ("skew", "check")}
    code, said = _said(capsys, "report", str(folder), "-o", str(tmp_path / "page.html"))
    found["report"] = (code, [line.strip() for line in said[1:]])
    return found


def _mesh_answers(lines: list[str], sites: dict[str, str]) -> None:
    first = lines[0]
    assert first.startswith("HANG: rank 3 holds the job up: ranks 0-2 wait on it"), first
    # its last launch: step 5's tp all-reduce (#5: the 6th of its tp group), at its call site
    assert f"Its last launch was allreduce #{job.STOP_STEP} of group " in first
    assert f"at {sites['tp']}" in first
    blocked = [line for line in lines[1:] if line.startswith("blocked: ")]
    # rank 1: in dp {1, 3}'s all-reduce #5, which rank 3 never entered
    assert any(line.startswith(f"blocked: rank 1 in allreduce #{job.STOP_STEP} of group ")
               and f"at {sites['dp']}, which rank 3 never entered" in line
               for line in blocked), blocked
    # ranks 0 and 2: in step 5's broadcast of the default group
    assert any(line.startswith(f"blocked: ranks 0 and 2 in broadcast #{job.STOP_STEP} of group 0")
               and f"at {sites['broadcast']}" in line for line in blocked), blocked
    assert not any("held the others up most" in line for line in lines)


@pytest.mark.parametrize("way", WAYS_IN)
def test_the_mesh_hang_names_rank_3_and_who_waits_on_it(hung, capsys, tmp_path: Path,
                                                        way: str) -> None:
    """Rank 3 stops after step 5's tp all-reduce: every command leads with it, exit 1 — on
    the record files (with the dumps beside them) and on torch's Flight Recorder dumps
    alone."""
    out, results = _given(hung, "mesh", way)
    assert results[3]["stuck"] is None and all(r["stuck"] for r in results[:3])
    sites = results[0]["sites"]
    for name, (code, lines) in _lead(capsys, tmp_path, out).items():
        assert code == 1, name
        _mesh_answers([line.strip() for line in lines], sites)
    code, said = _said(capsys, "skew", "--json", str(out))
    answer = json.loads("\n".join(said))["hang"]
    assert [c["rank"] for c in answer["culprits"]] == [3]
    assert answer["culprits"][0]["holds_up"] == [0, 1, 2]
    assert answer["culprits"][0]["last_launch"]["call_site"] == sites["tp"]
    page = (tmp_path / "page.html").read_text()
    first = page.index('class="lead')
    assert page.index('id="hang"') == page.index("id=", first) and 'id="straggler"' not in page


def test_a_rank_asleep_outside_any_collective_is_named_while_it_sleeps(
        capsys, tmp_path: Path, monkeypatch) -> None:
    """Rank 3 sleeps after step 5's tp all-reduce, alive: the commands read the files the job
    is still writing and name it, as they name a rank that stopped. While it sleeps every
    rank dumps torch's Flight Recorder ring when asked: the dumps alone, and the dumps with
    the record files, name it too. Once it wakes and the job ends, no hang is left to say."""
    if FR_DUMPS:
        monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    out = tmp_path / "job"
    out.mkdir()
    ran: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: ran.update(
        results=job.run("sleep", out, job.SLEEP_S + 30)))  # (the others wait it out)
    worker.start()
    taken = {way: tmp_path / f"asleep{way}" for way in WAYS_IN if FR_DUMPS or way != "-fr"}
    try:
        lines: list[str] = []
        while worker.is_alive():  # (until all three ranks wait on the sleeper: then read it;
            time.sleep(0.5)  # on a loaded machine rank 1 may block well before 0 and 2)
            if not any(out.glob("*.jsonl")):
                continue
            code, lines = _said(capsys, "skew", "-q", str(out))
            if (lines and lines[0].startswith("HANG: rank 3 holds the job up: ranks 0-2 wait")
                    and any("rank 1 in" in x for x in lines)):
                break
        assert worker.is_alive(), "the job ended before the tools read it asleep"
        checked_code, checked = _said(capsys, "check", str(out))
        assert worker.is_alive(), "the job ended before check read it asleep"
        (out / job.DUMP_REQUEST).touch()  # every rank dumps its ring, the sleeper too
        dumps = [out / f"{job.FR_PREFIX}{rank}" for rank in range(job.WORLD) if FR_DUMPS]
        deadline = time.monotonic() + 10
        while not all(d.exists() for d in dumps) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(d.exists() for d in dumps), "a rank did not dump when asked"
        for folder in taken.values():
            folder.mkdir()
        for path in out.glob("*.jsonl"):  # (what the files said while it slept)
            for way in ("", "-records"):
                shutil.copy(path, taken[way] / path.name)
        for path in dumps:
            shutil.copy(path, taken[""] / path.name)
            path.rename(taken["-fr"] / path.name)
        assert worker.is_alive(), "the job ended before its files were taken asleep"
    finally:
        worker.join(90)
    assert not worker.is_alive() and all(r["stuck"] is None for r in ran["results"])
    sites = ran["results"][0]["sites"]
    _mesh_answers([line.strip() for line in lines], sites)
    assert code == 1 and checked_code == 1
    _mesh_answers([line.strip() for line in checked], sites)
    for way, folder in taken.items():
        for name, (code, said) in _lead(capsys, tmp_path, folder).items():
            assert code == 1, (way, name)
            _mesh_answers([line.strip() for line in said], sites)
    code, lines = _said(capsys, "skew", "-q", str(out))
    assert not any(line.startswith("HANG") for line in lines)


@pytest.mark.parametrize("way", WAYS_IN)
def test_a_mismatch_is_said_as_a_mismatch(hung, capsys, tmp_path: Path, way: str) -> None:
    """Rank 1 calls an all-gather where the others call an all-reduce (default group, step
    2): a mismatch naming both, at their call sites, not a hang. (torch's profiler names
    rank 1's "_allgather_base", its Flight Recorder "allgather".)"""
    out, results = _given(hung, "mismatch", way)
    odd, even = results[job.MISMATCH_RANK]["sites"]["odd"], results[0]["sites"]["even"]
    gather = "allgather" if way == "-fr" else "_allgather_base"
    found = _lead(capsys, tmp_path, out)
    for name in ("skew", "report"):
        code, lines = found[name]
        assert code == 1 and lines[0].startswith(
            f"MISMATCH: group 0 (default_pg) #{job.MISMATCH_STEP}: "), lines
        assert f"rank 1 launched {gather} (" in lines[0]
        assert "ranks 0, 2 and 3 launched allreduce (256 B, Float)" in lines[0]
        assert not any(line.startswith("HANG") for line in lines)
    code, lines = found["check"]
    assert code == 1 and lines[0].startswith("DIVERGES: ")
    assert f"rank 1: {gather} " in lines[0] and f"at {odd}" in lines[0]
    assert "rank 0: allreduce " in lines[0] and f"at {even}" in lines[0]


@pytest.mark.parametrize("way", WAYS_IN)
def test_two_independent_culprits_are_both_named(hung, capsys, tmp_path: Path,
                                                 way: str) -> None:
    """Pairs {0, 1} and {2, 3}: rank 1 stops before step 3, rank 3 before step 4."""
    out, results = _given(hung, "two", way)
    site = results[0]["sites"]["pair"]
    for name, (code, lines) in _lead(capsys, tmp_path, out).items():
        lines = [line.strip() for line in lines]
        assert code == 1, name
        assert lines[0].startswith("HANG: rank 1 holds the job up: rank 0 waits on it"), lines
        assert f"Its last launch was allreduce #{job.TWO_STOPS[1] - 1} of group" in lines[0]
        assert lines[1].startswith("HANG: rank 3 holds the job up: rank 2 waits on it"), lines
        assert f"Its last launch was allreduce #{job.TWO_STOPS[3] - 1} of group" in lines[1]
        assert f"blocked: rank 0 in allreduce #{job.TWO_STOPS[1]} of group" in lines[2]
        assert f"at {site}, which rank 1 never entered" in lines[2]


def _hung_rows(folder: Path, ranks: int, culprit: int, stop: int) -> None:
    """A generated job's rows: each step a tp all-reduce (groups of 8) and a default-group
    all-reduce; ``culprit`` stops after step ``stop``'s tp all-reduce, and every other rank
    is then stuck in that step's default-group all-reduce (entered, never ended)."""
    for rank in range(ranks):
        n = 2 * stop + 2 if rank != culprit else 2 * stop + 1
        seq = np.arange(n) // 2
        group = (np.arange(n) % 2 == 1).astype(np.uint32)  # 0: tp, 1: default
        t = 1e6 + 100.0 * np.arange(n)
        end = t + 50.0
        if rank != culprit:
            end[-1] = np.nan  # (stuck in it)
        columns = {"group": group, "seq": seq.astype(np.int64),
                   "collective": np.zeros(n, np.uint32), "size_bytes": np.full(n, 1024, np.int64),
                   "start_us": t, "end_us": end, "site": group.astype(np.int32),
                   "kernel": np.ones(n, np.uint8), "step": seq.astype(np.int32),
                   "dtype": np.zeros(n, np.uint32)}
        tp = rank // 8
        groups = [{"name": f"tp{tp}", "desc": "tp", "size": 8,
                   "ranks": list(range(8 * tp, 8 * tp + 8))},
                  {"name": "0", "desc": "default_pg", "size": ranks,
                   "ranks": list(range(ranks))}]
        rows.write(rows.Rows(rank, columns, groups, ["allreduce"],
                             ["/job/model.py:10", "/job/train.py:20"], run="big",
                             dtypes=["Float"]), folder / f"rank{rank:04d}.rows")


def test_a_hang_of_1024_ranks_is_named_in_a_few_lines_in_seconds(capsys, tmp_path: Path) -> None:
    """1,024 ranks, one culprit, 1,023 blocked: the culprit in one line, the blocked ranks in
    a few; each command under 10 s here."""
    _hung_rows(tmp_path, 1024, culprit=777, stop=12)
    for name in ("skew", "check", "report"):
        args = [str(tmp_path)] + (["-o", str(tmp_path / "page.html")] if name == "report" else [])
        started = time.monotonic()
        code, lines = _said(capsys, name, *args)
        took = time.monotonic() - started
        lines = [line.strip() for line in (lines[1:] if name == "report" else lines)]
        assert code == 1 and took < 10, (name, took)
        assert lines[0].startswith("HANG: rank 777 holds the job up: 1023 ranks wait on it")
        assert "Its last launch was allreduce #12 of group tp97" in lines[0]
        assert "at /job/model.py:10" in lines[0]
        blocked = [line for line in lines if line.startswith("blocked: ")]
        assert blocked == [line for line in lines[1:len(blocked) + 1]]
        assert len(blocked) == 1, blocked
        assert blocked[0].startswith("blocked: ranks 0-1023 but 777 in allreduce #12 of group 0")
        assert blocked[0].endswith("at /job/train.py:20, which rank 777 never entered")
    page = (tmp_path / "page.html").read_text()
    assert page.index('id="hang"') < page.index("<h2>")  # (the page says it first)
    _, whole = _said(capsys, "skew", str(tmp_path))
    code, parted = _said(capsys, "skew", "--partition-launches", "4000", str(tmp_path))
    assert code == 1 and parted[:2] == whole[:2]  # (in partitions: the same lead)


def test_ranks_that_wait_on_each_other_are_a_cycle_not_a_culprit() -> None:
    """Rank 0 entered group A's #3 and waits on rank 1 (at #2 there); rank 1 entered group
    B's #5 and waits on rank 0 (at #4): a deadlock, no culprit."""
    groups = [hang.GroupProgress("A", "", 2, (0, 1), {0: 3, 1: 2}),
              hang.GroupProgress("B", "", 2, (0, 1), {0: 4, 1: 5})]
    found = hang.wait_for(groups)
    assert found is not None and found.culprits == [] and found.cycles == [[0, 1]]
    said = hang.lines(found, groups, lambda *_: None, lambda r: f"ranks {r}")
    assert said[0].startswith("HANG: ranks [0, 1] wait on each other (a deadlock")


def test_ranks_that_all_reached_the_same_place_are_no_hang() -> None:
    """Every member at #7: no hang. A member with no record at all: a culprit where the group
    never went past its first instance (it never started); past it, it took part and its
    files are lost (no hang: said as missing). A rank behind at an instance some rank
    finished took part in it too."""
    every = (0, 1, 2)
    assert hang.wait_for([hang.GroupProgress("A", "", 3, every, {0: 7, 1: 7, 2: 7})]) is None
    never = hang.wait_for([hang.GroupProgress("A", "", 3, every, {0: 7, 1: 7}, first=7)])
    assert never is not None and never.culprits == [2] and never.held_up[2] == [0, 1]
    assert hang.wait_for([hang.GroupProgress("A", "", 3, every, {0: 7, 1: 7})]) is None
    behind = [hang.GroupProgress("A", "", 2, (0, 1), {0: 7, 1: 5})]
    assert hang.wait_for(behind).culprits == [1]
    behind[0].finished = 6  # (#6 ended on some rank: rank 1 was in it, its record lost)
    assert hang.wait_for(behind).culprits == [1]  # (#7 not known finished)
    behind[0].finished = 7
    assert hang.wait_for(behind) is None


def test_summary_reads_the_dumps_alone(hung, capsys) -> None:
    """``summary`` of the mesh job's Flight Recorder dumps alone: each group's collectives, as
    the job launched them (steps 0-5; in step 5 only some ranks came to the default group's
    broadcast and to dp {1, 3}'s all-reduce: those instances are counted on the ranks there)."""
    out, _ = _given(hung, "mesh", "-fr")
    code, said = _said(capsys, "summary", "--json", str(out))
    rows = {(r["group_desc"], r["collective"]): r for r in json.loads("\n".join(said))[
        "instance_rows"]}
    assert code == 0
    assert rows[("default_pg", "broadcast")]["instances"] == job.STOP_STEP + 1
    assert rows[("default_pg", "broadcast")]["ranks"] == job.WORLD
    assert rows[("default_pg", "broadcast")]["size_bytes"] == 64 * 4
    assert {(d, c) for d, c in rows} == {("default_pg", "broadcast"), ("tp", "allreduce"),
                                        ("dp", "allreduce")}

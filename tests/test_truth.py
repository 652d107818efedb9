"""Issue 37: the cross-rank answers against planted truth (``truth_jobs.py``: real 4-rank gloo
jobs with one delay of known rank, step, size and call site). Every expectation comes from the
plant: the rank that slept, where, and for how long; never from another path of the tool."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import truth_jobs as truth

from autoannot import cli
from autoannot.traces.analysis import lineup
from autoannot.traces.read import rank_files
from autoannot.traces.render import skew

DELAY_US = truth.DELAY_S * 1e6
WAITING = truth.WORLD - 1  # the ranks that wait for the planted one


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, tuple[Path, list[dict]]]:
    made = {}
    for kind in ("compute", "chain", "hang"):
        out = tmp_path_factory.mktemp(kind)
        made[kind] = (out, truth.run(kind, out))
    missing = tmp_path_factory.mktemp("missing")
    for path in made["compute"][0].iterdir():  # rank 3's files gone: a dead node's shape
        if "rank3" not in path.name:
            shutil.copy(path, missing / path.name)
    made["missing"] = (missing, made["compute"][1])
    return made


def _skew(capsys, *args: str) -> tuple[int, dict]:
    code = cli.main(["skew", "-q", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def _inputs(out: Path) -> dict[str, list[str]]:
    """The same job given three ways: its folder (rows), traces with record files, records."""
    traces = sorted(map(str, out.glob("trace_rank?.json")))
    records = sorted(map(str, out.glob("rank?.jsonl")))
    return {"folder": [str(out)], "traces": traces + records, "records": records}


@pytest.mark.parametrize("kind, site", [("compute", "broadcast"), ("chain", "pair")])
def test_the_planted_rank_and_call_site_come_first_with_the_whole_delay(jobs, capsys, kind,
                                                                        site) -> None:
    out, results = jobs[kind]
    planted = truth.PLANTED_RANK[kind]
    where = results[planted]["sites"][site]
    for given, args in _inputs(out).items():
        code, said = _skew(capsys, *args)
        assert code == 0, (given, said["problems"])
        top = said["origins"][0]
        assert (top["rank"], top["call_site"]) == (planted, where), (given, top)
        if given != "records":  # (record files carry no profiler steps)
            assert top["step"] == truth.PLANTED_STEP, given
        # blamed once: delay x the ranks that waited, within 10%
        assert abs(top["blamed_us"] - DELAY_US * WAITING) <= 0.1 * DELAY_US * WAITING, (
            given, top)
        # and nobody else is blamed for a share of it (what else is there: this busy
        # machine's own hiccups, a few ms each, passed on to the ranks after them)
        assert all(o["blamed_us"] < 0.2 * DELAY_US for o in said["origins"][1:]), given
        ranks = {r["rank"]: r for r in said["ranks"]}
        assert ranks[planted]["others_waited_for_it_us"] == pytest.approx(
            DELAY_US * WAITING, rel=0.1)
        assert said["lead"][0].startswith(f"rank {planted} held the others up most")


@pytest.mark.parametrize("kind", ["compute", "chain"])
def test_no_rank_waits_more_than_the_delay_in_the_planted_step(jobs, capsys, kind) -> None:
    """A rank cannot wait in two collectives at once: over the planted step each rank waited at
    most the delay (plus gloo's own time), never once per collective the delay went through."""
    out, _ = jobs[kind]
    for given, args in _inputs(out).items():
        _, said = _skew(capsys, *args)
        if given == "records":
            step = [i for i in said["instances"]
                    if i["group"] == "0" and 3 * 3 <= i["seq"] < 4 * 3]  # step 3's three
        else:
            step = [i for i in said["instances"] if i["step"] == truth.PLANTED_STEP]
        assert step
        for rank in range(truth.WORLD):
            waited = sum(i["ranks"][str(rank)]["wait_us"] for i in step
                         if str(rank) in i["ranks"])
            assert waited <= 1.1 * DELAY_US, (given, rank, waited)


def test_start_up_is_warm_up_not_the_straggler(jobs, capsys) -> None:
    """Rank 3 starts late (before its first collective): shown, but not ranked, by default.
    The planted lateness is what the ranks lived: the last rank's arrival at its first
    collective less the first rank's. That last rank is not always rank 3: under load (4 ranks
    on 2 cores) another rank's start-up came 0.18 s after rank 3's 0.3 s sleep ended."""
    out, results = jobs["compute"]
    arrivals = [r["arrived"] for r in results]
    planted_us = (max(arrivals) - min(arrivals)) * 1e6
    assert planted_us >= truth.WARMUP_S * 1e6 / 3
    _, said = _skew(capsys, str(out))
    first = next(i for i in said["instances"] if i["seq"] == 0 and i["group"] == "0")
    assert first["warmup"] and abs(first["skew_us"] - planted_us) <= 0.1 * planted_us
    assert all(o["step"] != 0 for o in said["origins"])
    _, counted = _skew(capsys, "--include-warmup", str(out))
    assert any(o["step"] == 0 and o["blamed_us"] >= 0.9 * planted_us
               for o in counted["origins"])


def test_a_rank_with_no_files_is_named_by_every_tool(jobs, capsys, tmp_path: Path) -> None:
    out, _ = jobs["missing"]
    code, said = _skew(capsys, str(out))
    assert code == 1
    assert said["lead"][0].startswith("MISSING: group 0 (default_pg): rank 3 left no record")
    assert cli.main(["check", str(out)]) == 1
    text = capsys.readouterr().out
    assert text.startswith("MISSING: group 0 (default_pg): rank 3 of its 4 ranks left no record")
    page = tmp_path / "page.html"
    assert cli.main(["report", "-q", str(out), "-o", str(page)]) == 1
    first = re.search(r'<p class="lead[^"]*" id="(\w+)">(.*?)</p>', page.read_text())
    assert first.group(1) == "missing" and "rank 3 left no record" in first.group(2)


def test_a_hang_names_the_rank_that_never_came(jobs, capsys, tmp_path: Path) -> None:
    """Rank 3 leaves before step 3's broadcast: the record files (all a hang leaves) say where
    each rank stopped, rank 3 first."""
    out, results = jobs["hang"]
    assert results[3]["stuck"] is None and results[0]["stuck"]  # (the others were stuck)
    code, said = _skew(capsys, str(out))
    assert code == 1
    line = said["lead"][0]
    assert line.startswith("HANG: rank 3 holds the job up: ranks 0-2 wait on it")
    before = 3 * truth.PLANTED_STEP - 1  # its last: step 2's all-reduce
    # (issue 46) with the call sites: its last launch's, and the one it never entered
    broadcast = results[0]["sites"]["broadcast"]
    assert f"Its last launch was allreduce #{before} of group 0 (default_pg) at " \
        f"{truth.__file__}:" in line
    assert said["lead"][1].strip() == (f"blocked: ranks 0-2 in broadcast #{before + 1} of group "
                                       f"0 (default_pg) at {broadcast}, which rank 3 never "
                                       "entered")
    # a hang leads with its culprit and who waits on it, never with a straggler
    assert len(said["lead"]) == 2 and said["hang"]["culprits"][0]["rank"] == 3
    assert cli.main(["check", str(out)]) == 1
    capsys.readouterr()
    page = tmp_path / "hang.html"
    assert cli.main(["report", "-q", str(out), "-o", str(page)]) == 1
    text = page.read_text()
    assert "HANG: rank 3 holds the job up" in text and 'id="straggler"' not in text


def test_the_analysis_of_the_same_files_is_the_same_however_they_are_named(jobs,
                                                                           capsys) -> None:
    """A folder, or its traces named one by one (their rows beside them): one answer."""
    out, _ = jobs["compute"]
    _, by_folder = _skew(capsys, str(out))
    _, by_files = _skew(capsys, *sorted(map(str, out.glob("trace_rank?.json"))))
    assert by_files["origins"][0] == by_folder["origins"][0]
    assert len(by_files["instances"]) == len(by_folder["instances"]) == truth.STEPS * 3


def test_lead_of_an_analysis(jobs) -> None:
    out, _ = jobs["compute"]
    analysis = lineup.analyze_files([], [], rows=sorted(out.glob("*.rows.parquet")))
    assert skew.lead(analysis)[0].startswith("rank 2 held the others up most")


def test_two_runs_in_one_folder_are_lined_up_one_at_a_time(jobs, capsys, tmp_path: Path) -> None:
    """A job run twice into one folder: its record files hold both runs (the template appends),
    its traces and rows the first. Without --run every command refuses, naming both; with it,
    each run is lined up on its own: the first from its rows, the second from its records."""
    folder = tmp_path / "run"
    shutil.copytree(jobs["compute"][0], folder)
    for rank in range(truth.WORLD):  # the chain job as the folder's second run
        later = (jobs["chain"][0] / f"rank{rank}.jsonl").read_text()
        with open(folder / f"rank{rank}.jsonl", "a") as handle:
            handle.write(later)
    first = json.loads((folder / "rank0.jsonl").read_text().splitlines()[0])["run"]
    second = json.loads(later.splitlines()[0])["run"]
    for command in ("skew", "check", "report"):
        extra = ["-o", str(tmp_path / "page.html")] if command == "report" else []
        assert cli.main([command, str(folder), *extra]) == 2, command
        said = capsys.readouterr().err
        assert first in said and second in said and "--run" in said, (command, said)
    code, by_first = _skew(capsys, str(folder), "--run", first)
    assert code == 0 and by_first["origins"][0]["rank"] == truth.PLANTED_RANK["compute"]
    code, by_second = _skew(capsys, str(folder), "--run", second)
    assert code == 0 and by_second["origins"][0]["rank"] == truth.PLANTED_RANK["chain"]
    assert by_second["origins"][0]["call_site"] == jobs["chain"][1][1]["sites"]["pair"]
    assert cli.main(["check", str(folder), "--run", second]) == 0


def test_an_output_never_overwrites_an_input_even_with_force(jobs, capsys,
                                                             tmp_path: Path) -> None:
    folder = tmp_path / "in"
    shutil.copytree(jobs["compute"][0], folder)
    trace = folder / "trace_rank0.json"
    before = trace.read_bytes()
    for out in (trace, folder / "notes.json"):  # a trace; any other file in the folder
        out.touch()
        kept = out.read_bytes()
        assert cli.main(["skew", "-q", str(folder), "-o", str(out), "--force"]) == 2
        assert "is an input of this command" in capsys.readouterr().err
        assert out.read_bytes() == kept
    assert trace.read_bytes() == before
    # what autoannot wrote there itself is no input: a second run writes over its own page
    page = folder / "report.html"
    assert cli.main(["report", "-q", str(folder), "-o", str(page)]) == 0
    assert cli.main(["report", "-q", str(folder), "-o", str(page)]) == 0


def test_a_record_file_cut_by_a_killed_job_keeps_its_whole_lines(jobs, capsys,
                                                                 tmp_path: Path) -> None:
    folder = tmp_path / "killed"
    folder.mkdir()
    for rank in range(truth.WORLD):
        text = (jobs["compute"][0] / f"rank{rank}.jsonl").read_text()
        if rank == 1:
            text = text[:-40]  # its last line cut short (no end of line)
        (folder / f"rank{rank}.jsonl").write_text(text)
    code, said = _skew(capsys, str(folder))
    assert code == 1  # (rank 1's last collective is gone: rank 1 is named as stopped there)
    assert any("rank1.jsonl:15: its last line was cut short" in n for n in said["notes"])
    behind = [{k: b[k] for k in ("rank", "seq", "collective")}
              for b in said["missing"][0]["behind"]]
    assert behind == [{"rank": 1, "seq": 13, "collective": "_allgather_base"}]


def test_a_fifo_in_a_folder_is_skipped_never_opened(jobs, capsys, tmp_path: Path) -> None:
    import os

    folder = tmp_path / "with-fifo"
    shutil.copytree(jobs["compute"][0], folder)
    os.mkfifo(folder / "stray.rows")
    os.mkfifo(folder / "stray.jsonl")
    code = cli.main(["skew", "-q", "--json", str(folder)])  # (a FIFO opened: blocked)
    captured = capsys.readouterr()
    assert code == 0
    assert json.loads(captured.out)["origins"][0]["rank"] == truth.PLANTED_RANK["compute"]
    assert "stray.rows: not a regular file" in captured.err
    assert "stray.jsonl: not a regular file" in captured.err


def test_the_page_shows_the_planted_step(jobs, tmp_path: Path) -> None:
    """The page's axis is the profiler's steps, and its one-step view is the step where the
    most waiting began: the planted one."""
    out, _ = jobs["compute"]
    page = tmp_path / "page.html"
    assert cli.main(["report", "-q", str(out), "-o", str(page)]) == 0
    text = page.read_text()
    assert f"Profiler step {truth.PLANTED_STEP}: the " in text
    assert '"title":{"text":"profiler step"}' in text  # (the heat map's x axis)


def test_steps_are_read_from_a_trace_in_kinetos_streamed_layout(jobs, tmp_path: Path) -> None:
    """A trace as Kineto writes it on a GPU build (one event per block, streamed, never parsed
    whole) gives its collectives the same profiler steps as the same events parsed whole (its
    ProfilerStep ranges were left out of the streamed pass)."""
    from autoannot.traces import files

    out, _ = jobs["compute"]
    original = out / "trace_rank2.json"
    document = json.loads(original.read_text())
    head = {k: v for k, v in document.items() if k != "traceEvents"}
    streamed = tmp_path / "trace_rank2.json"
    streamed.write_text(json.dumps(head)[:-1] + ', "traceEvents": [\n  {\n'
                        + files._SEPARATOR.join(files.dump_event(e)
                                                for e in document["traceEvents"])
                        + "\n  }\n  ]\n}")
    assert files.Trace(streamed).head is not None  # (read in the streamed passes)
    rank, _, gloo = rank_files.trace_launches(streamed)
    _, _, expected = rank_files.trace_launches(original)
    assert rank == 2 and [g[4] for g in gloo] == [g[4] for g in expected]
    assert truth.PLANTED_STEP in {g[4] for g in gloo}

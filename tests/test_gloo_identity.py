"""Issue 37: gloo's profiler ranges are joined with the record file's launches by identity (the
collective, its input's size where the profiler recorded shapes, the group's worker thread),
never by order alone: two async all-reduces that gloo's two worker threads started in swapped
order keep their own timings (``async_gloo_job.py``: a real 2-rank job)."""

from __future__ import annotations

import json
from pathlib import Path

import async_gloo_job as job
import numpy as np
import pytest

from autoannot import cli
from autoannot.traces import files
from autoannot.traces.read import rank_files
from autoannot.traces.table import rows

DATA = Path(__file__).parent / "data" / "gloo_async"


def _range_sizes(trace: Path) -> dict[float, int]:
    """Each gloo range's input size in bytes, by its start (read here from the JSON)."""
    events = json.loads(trace.read_text())["traceEvents"]
    return {round(e["ts"], 3): e["args"]["Input Dims"][0][0] * 4 for e in events
            if str(e.get("name", "")).startswith("gloo:")}


def _timed_by_another(made: rows.Rows, trace: Path) -> int:
    """Rows whose start is that of a range of another size: another collective's timing."""
    sizes = _range_sizes(trace)
    starts = np.asarray(made.columns["start_us"]).tolist()
    return sum(sizes[round(s, 3)] != z
               for s, z in zip(starts, np.asarray(made.columns["size_bytes"]).tolist(),
                               strict=True))


@pytest.mark.parametrize("rank", [0, 1])
def test_swapped_ranges_of_a_real_job_keep_their_own_collectives(rank: int) -> None:
    """The committed run (its ranges swapped 5 and 2 times): every row timed by its own
    collective's range (by order, 14 of its 400 rows were not)."""
    trace = DATA / f"trace_rank{rank}.json"
    record = DATA / f"rank{rank}.jsonl"
    assert job.swaps(trace) > 0  # (what the test is about is in the data)
    assert files.Trace(trace).head is None  # (json.dump's indent=1: read whole, not streamed)
    run = json.loads(record.read_text().splitlines()[0])["run"]
    made = rank_files.rows_of_trace(trace, record, run=run)
    assert len(made) == 200 and _timed_by_another(made, trace) == 0
    sizes = np.asarray(made.columns["size_bytes"])
    assert sorted(set(sizes.tolist())) == [job.SMALL * 4, job.LARGE * 4]


def test_rows_written_by_a_live_job_keep_their_own_collectives(tmp_path: Path, capsys) -> None:
    """The same job run now: the rows each rank writes at export, read back, are each timed by
    their own collective's range, and the cross-rank analysis lines them up."""
    job.run(tmp_path, steps=60)
    for rank in range(job.WORLD):
        written = rows.read(rows.rows_beside(tmp_path / f"trace_rank{rank}.json"))
        assert len(written) == 120
        assert _timed_by_another(written, tmp_path / f"trace_rank{rank}.json") == 0
    assert cli.main(["skew", "-q", "--json", str(tmp_path)]) == 0
    said = json.loads(capsys.readouterr().out)
    assert len(said["instances"]) == 120 and not said["problems"] and not said["missing"]


def _not_on_their_works_thread(made: rows.Rows, trace: Path, truth: dict) -> tuple[int, int]:
    """Rows timed by a range on another thread than the one their Work completed on (the
    job's own record of it: its callbacks' thread), and how many rows that truth covers (a
    Work that completed before its callback was added was told on the job's own thread)."""
    events = json.loads(trace.read_text())["traceEvents"]
    thread_of = {round(e["ts"], 3): e["tid"] for e in events
                 if str(e.get("name", "")).startswith("gloo:")}
    sizes = np.asarray(made.columns["size_bytes"]).tolist()
    starts = np.asarray(made.columns["start_us"]).tolist()
    wrong = covered = 0
    for i, (start, size) in enumerate(zip(starts, sizes, strict=True)):
        told = truth["steps"][i // 2][str(size)]
        if told != truth["main"]:
            covered += 1
            wrong += thread_of[round(start, 3)] != told
    return wrong, covered


def _started_swapped(made: rows.Rows) -> int:
    """Steps whose second launch's range started first."""
    starts = np.asarray(made.columns["start_us"]).tolist()
    return sum(starts[i + 1] < starts[i] for i in range(0, len(starts), 2))


def test_async_pair_without_shapes_or_record_file_keeps_its_own_timings(
        tmp_path: Path, capsys) -> None:
    """Issue 50: ``AUTOANNOT=1`` alone (no record file), the profiler recording no shapes: the
    rows written at export name every collective (the launches the agent held in the
    profiler's window), and each is timed by its own range — the one on the thread its Work
    completed on, as the job's own callbacks saw it — every row (by start order alone, ranges
    swapped 2-5 times in 100 steps)."""
    steps = 100
    job.run(tmp_path, steps=steps, shapes=False, record=None)
    assert not list(tmp_path.glob("*.jsonl"))
    swapped = 0
    for rank in range(job.WORLD):
        trace = tmp_path / f"trace_rank{rank}.json"
        written = rows.read(rows.rows_beside(trace))
        assert len(written) == 2 * steps
        sizes = np.asarray(written.columns["size_bytes"]).tolist()
        assert sizes == [job.SMALL * 4, job.LARGE * 4] * steps  # (in launch order)
        truth = json.loads((tmp_path / f"completions_rank{rank}.json").read_text())
        wrong, covered = _not_on_their_works_thread(written, trace, truth)
        assert wrong == 0 and covered >= steps // 2  # (most complete after their callback)
        swapped += _started_swapped(written)
    assert cli.main(["skew", "-q", "--json", str(tmp_path)]) == 0
    said = json.loads(capsys.readouterr().out)
    assert len(said["instances"]) == 2 * steps and not said["problems"]
    print(f"ranges started swapped in {swapped} of {job.WORLD * steps} steps")

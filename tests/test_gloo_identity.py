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

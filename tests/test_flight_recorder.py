"""torch's Flight Recorder dumps read as a rank's launches (``read/flight_recorder.py``): a
real NCCL dump made on the device (``tests/gpu/fr_dump_nccl.py``: one rank, torch 2.11,
NCCL 2.28.9; its call sites as the script saw them) — gloo's are made by torch in
``tests/test_hang.py``'s jobs — and a dump that is not one is never run."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from autoannot.traces.read import flight_recorder

NCCL = Path(__file__).parent / "data" / "flight_recorder" / "nccl_1rank"


def test_an_nccl_dump_reads_as_the_launches_the_job_made() -> None:
    """Every collective in order, with its group (members from ``pg_config``), its call site
    in the job's code, and its end where the watchdog saw it complete."""
    expected = json.loads((NCCL / "expected.json").read_text())["sites"]
    dump = NCCL / "nccl_trace_rank_0"
    assert flight_recorder.is_dump(dump)
    one = flight_recorder.read([dump])[0]
    assert one.rank == 0 and one.extra["never_completed"] is False
    groups = {g["desc"] or g["name"]: g for g in one.groups}
    assert groups["default_pg"]["ranks"] == [0] and groups["tp"]["ranks"] == [0]
    c = one.columns
    said = [(one.collectives[c["collective"][i]],
             "0" if one.groups[c["group"][i]]["desc"] == "default_pg" else "tp",
             one.sites[c["site"][i]]) for i in range(len(one))]
    assert said == [tuple(site) for site in expected]
    seqs: dict[str, list[int]] = {}
    for i in range(len(one)):
        seqs.setdefault(one.groups[c["group"][i]]["name"], []).append(int(c["seq"][i]))
    assert all(s == list(range(len(s))) for s in seqs.values())  # (from 0, in order)
    assert all(c["end_us"][i] >= c["start_us"][i] for i in range(len(one)))
    assert all(c["size_bytes"][i] == 4 * 1024 for i in range(len(one)))  # (1,024 floats)


def test_a_pickle_that_is_no_dump_is_never_run(tmp_path: Path) -> None:
    """A file named like a dump whose pickle would make an object (here: run a command) is
    no dump, and nothing of it runs."""
    made = tmp_path / "ran"

    class Runs:
        def __reduce__(self):
            return (Path.touch, (made,))

    bad = tmp_path / "nccl_trace_rank_0"
    bad.write_bytes(pickle.dumps({"version": "2.10", "entries": [Runs()]}))
    assert not flight_recorder.is_dump(bad) and flight_recorder.load(bad) is None
    assert not made.exists()
    plain = tmp_path / "nccl_trace_rank_1"
    plain.write_bytes(pickle.dumps({"version": "2.10", "entries": [], "pg_config": {}}))
    assert flight_recorder.is_dump(plain)


def test_a_json_dump_reads_as_its_pickle_does(tmp_path: Path, monkeypatch) -> None:
    """torch's JSON dump and its pickle of the same ring (a real 2-rank gloo job): the same
    launches (the JSON holds no stack: no call sites); dumps of two versions are refused."""
    import sys

    import pytest

    sys.path.insert(0, str(Path(__file__).parent))
    import hang_jobs
    import torch
    from harness import run_ranks

    from autoannot.traces import files

    if not hasattr(torch._C._distributed_c10d, "_dump_fr_trace"):
        pytest.skip("this torch's Flight Recorder dumps no gloo group's ring (torch._C."
                    "_distributed_c10d has no _dump_fr_trace)")
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "100")
    sites = run_ranks(hang_jobs.dump_both, 2, "gloo", (str(tmp_path),))
    pickled = flight_recorder.read(sorted(tmp_path.glob("nccl_trace_rank_*")))
    as_json = flight_recorder.read(sorted(tmp_path.glob("json_*.json")))
    for p, j in zip(pickled, as_json, strict=True):
        assert p.rank == j.rank and len(p) == len(j) == 3
        for name in ("seq", "size_bytes", "start_us"):
            assert list(p.columns[name]) == list(j.columns[name])
        assert [p.collectives[c] for c in p.columns["collective"]] == ["allreduce"] * 3
        assert [p.sites[s] for s in p.columns["site"]] == [sites[p.rank]] * 3
        assert list(j.columns["site"]) == [-1] * 3  # (torch's JSON dump holds no stack)
    old = tmp_path / "nccl_trace_rank_9"
    old.write_bytes(pickle.dumps({"version": "2.0", "entries": [], "pg_config": {}}))
    with pytest.raises(files.TraceError, match="different versions"):
        flight_recorder.read([tmp_path / "nccl_trace_rank_0", old])

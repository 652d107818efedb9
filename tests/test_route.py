"""The one route every launch takes (``keep.route``): every launch kind the suite has is written
by it alone, the fast method gives what the whole rule gives, launch for launch (records,
record-file lines, ledger entries, ring records), and the rule of who gets what holds: the
record file before the launch runs, the ledger and the recorders once it was issued, a launch
below the Python API kept from a recorder that asked for the Python API's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import route_cases
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from harness import run_ranks

import autoannot
from autoannot import testing
from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT
from autoannot.describe.kinds import Kind
from autoannot.keep import ring
from autoannot.keep.journal import Journal
from autoannot.traces.read import ring_files

#: What differs between two runs of one workload in a record file's lines: the times, and the
#: run's name (which holds the time its file was opened).
_TIMES = ("monotonic_ns", "wall_ns", "run")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("native", [False, True], ids=["python", "native module"])
def test_every_launch_kind_is_written_by_the_route_alone(native: bool, monkeypatch,
                                                         tmp_path: Path, request) -> None:
    """Every launch kind the suite runs on the CPU — the Python API, a coalesced block,
    ``pg.*``, DDP's reducer, compiled code, a graph's replay — with the always-on ring alone,
    ``record()`` alone, and everything open at once (a record file, a ring, ``record()``, a
    capture): each is written, and every write of a ring record, a record-file line, a ledger
    entry or a recorder's record in Python is made by the route (``keep/route.py``), with the
    native module built and without (its C++ writes the ring's records of launches it knows:
    counted in the ring; ``test_ring_format.py``: one packer a language)."""
    if native:
        build = request.getfixturevalue("native_build")
        monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(Path(build).parent.parent))
    else:
        monkeypatch.setenv("AUTOANNOT_NATIVE", "0")
    results = run_ranks(route_cases.every_launch_kind, 2, args=(str(tmp_path),))
    for result in results:
        writes = result["writes"]
        callers = {caller for _, _, caller in writes}
        assert callers and all(caller.startswith("route.py:") for caller in callers), callers
        written = {launch for launch, _, _ in writes} | {
            launch for launch, records in result["in_ring"].items() if records}
        for mode in route_cases.MODES:
            for kind in route_cases.KINDS:
                if kind == "replay" and mode == "recorded":
                    continue  # (record() keeps no replay: its trace's kernels are the replay's)
                assert f"{mode}/{kind}" in written, (mode, kind, sorted(written))


def _workload() -> None:
    """Launches of several shapes, one that raises (not issued: in no ledger and no record),
    a coalescing block, and a funcol op, each from one line of this file."""
    t = torch.ones(8)
    dist.all_reduce(t)
    dist.broadcast(t, src=1)
    dist.all_gather_into_tensor(torch.empty(16), t)
    dist.reduce_scatter_tensor(torch.empty(4), t)
    dist.all_to_all_single(torch.empty(8), t, [3, 5], [4, 4])
    with pytest.raises(TypeError):  # (no reduce op: raises before launching)
        dist.all_reduce(t, op=object())
    with dist._coalescing_manager():
        dist.all_reduce(torch.ones(2))
        dist.all_reduce(torch.ones(3))
    funcol.all_reduce(t, "sum", dist.group.WORLD).wait()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)


def _whole_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every route made from now on runs each launch by its whole rule (``run_whole``: entered,
    then ended), not by its fast method."""
    from autoannot.keep import route

    made = route.Route.__init__

    def whole(self: route.Route, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        self.general = True

    monkeypatch.setattr(route.Route, "__init__", whole)


def _run(tmp_path: Path, name: str, whole: bool, monkeypatch: pytest.MonkeyPatch,
         journal: bool = False) -> dict[str, Any]:
    """The workload run by the route's fast method or its whole rule, with a recorder, a
    Python-API-only recorder and a stand-in capture open (and a record file: ``journal``)."""
    with monkeypatch.context() as patch:
        if whole:
            _whole_rule(patch)
        autoannot.enable()
        opened = Journal(str(tmp_path / f"{name}.jsonl")) if journal else None
        if opened is not None:
            AGENT.state.open_journal(opened)
        try:
            with autoannot.record() as everything, \
                    autoannot.record(python_api_only=True) as api_only, \
                    testing.stand_in() as graph:
                _workload()
            ledger = AGENT.captures.ledger_of(graph)
        finally:
            if opened is not None:
                AGENT.state.close_journal(opened)
                opened.close()
            autoannot.disable()
    lines = [{k: v for k, v in json.loads(line).items() if k not in _TIMES}
             for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()] if journal else []
    return {"records": list(everything), "api_only": list(api_only), "lines": lines,
            "ledger": ledger.entries}


def _ring_run(tmp_path: Path, name: str, whole: bool, monkeypatch: pytest.MonkeyPatch
              ) -> list[tuple[Any, ...]]:
    """The workload with a ring alone open, by the route's fast method or its whole rule: each
    record kept, as (seq, api, annotation, call site, failed)."""
    with monkeypatch.context() as patch:
        if whole:
            _whole_rule(patch)
        autoannot.enable()
        kept = ring.Ring(str(tmp_path / name), 64)
        AGENT.state.open_journal(kept)
        try:
            _workload()
        finally:
            AGENT.state.close_journal(kept)
            kept.close()
            autoannot.disable()
    one = ring_files.read(next((tmp_path / name).glob(f"*{ring.SUFFIX}")))
    return [(int(r["seq"]), one.kinds[int(r["kind"])]["api"],
             one.kinds[int(r["kind"])]["annotation"], one.sites[int(r["site"])],
             int(r["returned_ns"]) == ring.FAILED) for r in one.records]


def test_a_ring_gets_from_the_fast_method_what_the_whole_rule_gives_it(
        fake_world, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ring alone open: record for record what the route's fast method writes is what its
    whole rule writes (the launch that raised: entered, and marked failed)."""
    fast = _ring_run(tmp_path, "fast", False, monkeypatch)
    whole = _ring_run(tmp_path, "whole", True, monkeypatch)
    assert fast == whole
    assert [failed for *_, failed in fast].count(True) == 1
    assert all(Path(site).name.startswith("test_route.py:") for _, _, _, site, _ in fast)
    assert len(fast) >= 9


def test_the_fast_method_gives_what_the_whole_rule_gives_launch_for_launch(
        fake_world, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorders and a capture open: the records and the ledger of the fast method are the
    whole rule's; with a record file open too (the whole rule), the file has every launch,
    the one that raised too, as it is entered."""
    AGENT.captures.by_thread()  # (no CUDA here: a launch is in the capture of its thread)
    fast = _run(tmp_path, "fast", False, monkeypatch)
    whole = _run(tmp_path, "whole", True, monkeypatch)
    filed = _run(tmp_path, "filed", False, monkeypatch, journal=True)
    apis = [r.api for r in fast["records"]]
    assert "all_to_all_single" in apis and apis.count("all_reduce") == 2  # (the raise: none)
    assert len(fast["records"]) >= 8
    for what in ("records", "api_only", "ledger"):
        assert fast[what] == whole[what] == filed[what], what
    assert all(Path(r.call_site).name.startswith("test_route.py:") for r in fast["records"])
    # the file has the launch that raised (entered before it ran); ledger and records do not
    assert len(filed["lines"]) == len(fast["records"]) + 1
    assert len(fast["ledger"]) == len(fast["records"])


class _Recorder(list):
    python_api_only = True


def test_the_routes_rule_who_gets_what(fake_world, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entered: the record file only. Returned: the ledger (in a capture, unless the observer
    noted it itself) and the recorders (a launch below the Python API: not to one that asked
    for the Python API's launches only)."""
    AGENT.captures.by_thread()
    autoannot.enable()
    entered: list[Any] = []

    class _Journal:
        def enter(self, record: Any) -> None:
            entered.append(record)

    journal, api_only = _Journal(), _Recorder()
    AGENT.state.open_journal(journal)
    try:
        with autoannot.record() as everything, testing.stand_in() as graph:
            AGENT.state.open_recorder(api_only)
            kind = Kind("all_reduce", {"Collective name": "allreduce"}, {"Rank": 0}, ("k",),
                        None)
            route = AGENT.state.route
            below = route.entered(kind, "job.py:1", python_api=False)
            assert (len(entered), len(everything), len(AGENT.captures.ledger_of(graph).entries)
                    ) == (1, 0, 0)
            below.returned()
            route.unentered(kind, "job.py:2", noted=True).returned()
            AGENT.state.close_recorder(api_only)
        entries = AGENT.captures.ledger_of(graph).entries
    finally:
        AGENT.state.close_journal(journal)
        autoannot.disable()
    assert [r.call_site for r in everything] == ["job.py:1", "job.py:2"]
    assert [r.call_site for r in api_only] == ["job.py:2"]  # (the one below the API: not)
    assert [e["call_site"] for e in entries] == ["job.py:1"]  # (the noted one: not twice)
    assert entered[0].call_site == "job.py:1" and len(entered) == 1

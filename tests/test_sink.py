"""The launch event and its one sink: the proxies' inline hot path gives what the sink gives,
launch for launch (records, record-file lines, ledger entries), and the sink's rule of who gets
what holds: the record file before the launch runs, the ledger and the recorders once it was
issued, a launch below the Python API kept from a recorder that asked for the Python API's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import autoannot
from autoannot import testing
from autoannot.agent import patching
from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT
from autoannot.describe.kinds import Kind
from autoannot.keep import ring
from autoannot.keep.journal import Journal
from autoannot.keep.sink import LaunchEvent
from autoannot.observe import wrappers
from autoannot.traces.read import ring_files

#: What differs between two runs of one workload in a record file's lines: the times, and the
#: run's name (which holds the time its file was opened).
_TIMES = ("monotonic_ns", "wall_ns", "run")


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


def _run(tmp_path: Path, name: str, inline: bool, monkeypatch: pytest.MonkeyPatch
         ) -> dict[str, Any]:
    """The workload with the agent's wrappers made inline or through the sink, with a
    recorder, a Python-API-only recorder, a record file and a stand-in capture open."""
    monkeypatch.setattr(wrappers, "INLINE", inline)
    monkeypatch.setattr(AGENT, "proxies", patching.ProxyCache())  # (wrappers made afresh)
    autoannot.enable()
    journal = Journal(str(tmp_path / f"{name}.jsonl"))
    AGENT.state.open_journal(journal)
    try:
        with autoannot.record() as everything, \
                autoannot.record(python_api_only=True) as api_only, \
                testing.stand_in() as graph:
            _workload()
        ledger = AGENT.captures.ledger_of(graph)
    finally:
        AGENT.state.close_journal(journal)
        journal.close()
        autoannot.disable()
    lines = [{k: v for k, v in json.loads(line).items() if k not in _TIMES}
             for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    return {"records": list(everything), "api_only": list(api_only), "lines": lines,
            "ledger": ledger.entries}


def _ring_run(tmp_path: Path, name: str, inline: bool, monkeypatch: pytest.MonkeyPatch
              ) -> list[tuple[Any, ...]]:
    """The workload with a ring alone open (the wrappers then write it inline): each record
    kept, as (seq, api, annotation, call site, failed)."""
    monkeypatch.setattr(wrappers, "INLINE", inline)
    monkeypatch.setattr(AGENT, "proxies", patching.ProxyCache())
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


def test_a_ring_gets_from_the_inline_path_what_the_sink_gives_it(
        fake_world, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ring alone open: the wrappers write it inline; record for record what the sink
    writes (the launch that raised: entered, and marked failed)."""
    inline = _ring_run(tmp_path, "inline", True, monkeypatch)
    through_sink = _ring_run(tmp_path, "sink", False, monkeypatch)
    assert inline == through_sink
    assert [failed for *_, failed in inline].count(True) == 1
    assert all(Path(site).name.startswith("test_sink.py:") for _, _, _, site, _ in inline)
    assert len(inline) >= 9


def test_the_inline_path_gives_what_the_sink_gives_launch_for_launch(
        fake_world, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    AGENT.captures.by_thread()  # (no CUDA here: a launch is in the capture of its thread)
    inline = _run(tmp_path, "inline", True, monkeypatch)
    through_sink = _run(tmp_path, "sink", False, monkeypatch)
    apis = [r.api for r in inline["records"]]
    assert "all_to_all_single" in apis and apis.count("all_reduce") == 2  # (the raise: none)
    assert len(inline["records"]) >= 8
    for what in ("records", "api_only", "lines", "ledger"):
        assert inline[what] == through_sink[what], what
    assert all(Path(r.call_site).name.startswith("test_sink.py:") for r in inline["records"])
    # the file has the launch that raised (entered before it ran); ledger and records do not
    assert len(inline["lines"]) == len(inline["records"]) + 1
    assert len(inline["ledger"]) == len(inline["records"])


class _Recorder(list):
    python_api_only = True


def test_the_sinks_rule_who_gets_what(fake_world, monkeypatch: pytest.MonkeyPatch) -> None:
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
            sink = AGENT.sink
            below = LaunchEvent(kind, "job.py:1", python_api=False)
            sink.entered(below)
            assert (len(entered), len(everything), len(AGENT.captures.ledger_of(graph).entries)
                    ) == (1, 0, 0)
            sink.returned(below)
            noted = LaunchEvent(kind, "job.py:2", noted=True)
            sink.returned(noted)
            AGENT.state.close_recorder(api_only)
        entries = AGENT.captures.ledger_of(graph).entries
    finally:
        AGENT.state.close_journal(journal)
        autoannot.disable()
    assert [r.call_site for r in everything] == ["job.py:1", "job.py:2"]
    assert [r.call_site for r in api_only] == ["job.py:2"]  # (the one below the API: not)
    assert [e["call_site"] for e in entries] == ["job.py:1"]  # (the noted one: not twice)
    assert entered[0].call_site == "job.py:1" and len(entered) == 1

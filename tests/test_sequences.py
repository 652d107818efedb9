"""``autoannot check`` and ``AUTOANNOT_VERIFY``: ranks that launch different collectives are
found, offline from ledgers, record files and traces, and in the job at the end of a capture."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

import agent_hooks as hooks
import pytest
import torch
import torch.distributed as dist
from harness import run_ranks

from autoannot import cli

DATA = Path(__file__).parent / "data" / "gpu"


def a_branch_on_one_rank(rank: int, world: int, out: str) -> int:
    """Five collectives on every rank; rank 1 takes a branch that adds an all-gather before the
    fourth. Recorded (AUTOANNOT_RECORD's file). Returns the line of that extra call."""
    import autoannot
    from autoannot.keep.journal import Journal

    autoannot.enable()
    journal = Journal(f"{out}/rank{rank}.jsonl")
    hooks.AGENT.state.open_journal(journal)
    t = torch.ones(8)
    solo = dist.new_group([1])  # every rank takes part in creating it
    extra = 0
    for step in range(5):
        if step == 3 and rank == 1:
            extra = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
            dist.all_gather_into_tensor(torch.empty(8), t, group=solo)
        dist.all_reduce(t)
    hooks.AGENT.state.close_journal(journal)
    journal.close()
    autoannot.disable()
    return extra


def test_check_names_the_first_divergence_with_call_sites(tmp_path: Path, capsys) -> None:
    lines = run_ranks(a_branch_on_one_rank, 2, "gloo", (str(tmp_path),))
    records = sorted(str(p) for p in tmp_path.glob("rank*.jsonl"))
    # The all-gather ran on a group of its own: group 0's sequences agree.
    assert cli.main(["check", *records]) == 0
    capsys.readouterr()
    # The same two files with rank 1's all-gather on group 0 (what a branch on the default
    # group would have done): the divergence is at #3, named with both call sites.
    doctored = tmp_path / "doctored"
    doctored.mkdir()
    (doctored / "rank0.jsonl").write_text((tmp_path / "rank0.jsonl").read_text())
    rank1 = [json.loads(x) for x in (tmp_path / "rank1.jsonl").read_text().splitlines()]
    for entry in rank1:
        entry["group"] = "0"
    (doctored / "rank1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in rank1))
    assert cli.main(["check", str(doctored)]) == 1
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("DIVERGES")]
    assert "group 0 (default_pg), collective #3" in line
    assert "rank 0: allreduce 8->8 elements, Float" in line
    assert f"rank 1: _allgather_base 8->8 elements, Float, at {__file__}:{lines[1]}" in line


def test_check_on_the_committed_ledgers_and_a_doctored_one(tmp_path: Path, capsys) -> None:
    graphs = DATA / "graphs"
    assert cli.main(["check", str(graphs / "graph_rank0.autoannot"),
                     str(graphs / "graph_rank1.autoannot")]) == 0
    capsys.readouterr()
    doc = json.loads((graphs / "graph_rank1.autoannot").read_text())
    first = next(iter(doc["graphs"]))
    doc["graphs"][first][2]["annotation"]["dtype"] = "Half"  # rank 1 captured another dtype
    (tmp_path / "graph_rank1.autoannot").write_text(json.dumps(doc))
    assert cli.main(["check", str(graphs / "graph_rank0.autoannot"),
                     str(tmp_path / "graph_rank1.autoannot"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (divergence,) = report["divergences"]
    assert divergence["scope"] == first and divergence["position"] <= 2
    assert "Half" in divergence["ranks"]["1"] and "Half" not in divergence["ranks"]["0"]
    assert cli.main(["check", str(graphs / "graph_rank0.autoannot")]) == 1  # one rank: nothing
    assert cli.main(["check", str(tmp_path / "missing.autoannot")]) == 2


def capture_with_verify(rank: int, world: int, diverge: bool) -> dict[str, Any]:
    """A capture (the capture wrappers on a stand-in graph: no CUDA here) of two all-reduces
    with AUTOANNOT_VERIFY=1; where ``diverge``, rank 1's ledger gets a third collective before
    the capture ends (as a rank-dependent branch would have captured)."""
    import autoannot

    os.environ["AUTOANNOT_VERIFY"] = "1"
    autoannot.enable()
    hooks.AGENT.captures.by_thread()
    graph = type("Graph", (), {})()
    hooks.begin_capture(lambda: None, graph, (), {})
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(t)
    ledger = hooks.LEDGERS[graph._autoannot_graph]
    if diverge and rank == 1:
        ledger.entries.append({**ledger.entries[0], "annotation": {
            **ledger.entries[0]["annotation"], "In msg nelems": 99, "Out msg nelems": 99}})
    try:
        hooks.end_capture(lambda: None, graph, (), {})
        outcome = "captured"
    except autoannot.SequenceMismatch as exc:
        outcome = str(exc)
    autoannot.disable()
    return {"outcome": outcome, "entries": len(ledger.entries)}


@pytest.mark.parametrize("diverge", [False, True])
def test_verify_stops_a_diverging_capture_before_its_replay(diverge: bool) -> None:
    results = run_ranks(capture_with_verify, 2, "gloo", (diverge,))
    if not diverge:
        assert [r["outcome"] for r in results] == ["captured", "captured"]
        return
    for result in results:  # both ranks are told, each at the end of its capture
        assert result["outcome"].startswith("autoannot (AUTOANNOT_VERIFY): the ranks captured")
        assert "collective #2: rank 0: nothing (its sequence ended); rank 1: allreduce 99->99" \
            in result["outcome"]


def test_check_says_what_a_folder_lacks(tmp_path: Path, capsys) -> None:
    assert cli.main(["check", str(tmp_path)]) == 2
    assert "no ledger (*.autoannot), record file (*.jsonl) or trace" in capsys.readouterr().err

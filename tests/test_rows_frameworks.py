"""Issue 37: rows for every launch kind a framework makes — FSDP2 on 2 real gloo ranks, whose
gradient reduce-scatters gloo runs under its all-reduce's profiler name — written at export and
lined up, every collective of the record file there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from harness import run_job, skip_if_torch_cannot, torch_cannot

from autoannot import cli
from autoannot.traces.table import rows


def fsdp2_steps(rank: int, world: int, out: str) -> dict:
    """Two FSDP2 training steps of a two-layer model, profiled; the agent and the record file
    from the environment."""
    from torch.profiler import ProfilerActivity, profile

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError as exc:  # (torch < 2.6 keeps it under _composable)
        return torch_cannot("FSDP2's fully_shard", exc)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            model(torch.randn(8, 16)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    prof.export_chrome_trace(f"{out}/trace_rank{rank}.json")
    return {}


def test_fsdp2_reduce_scatters_on_gloo_become_rows(tmp_path: Path, capsys) -> None:
    results = run_job(fsdp2_steps, 2, tmp_path, (str(tmp_path),))
    skip_if_torch_cannot(results)
    made = sorted(tmp_path.glob("trace_rank?.rows*"))
    assert len(made) == 2, sorted(p.name for p in tmp_path.iterdir())
    recorded = [json.loads(line) for line in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    profiled = [r["annotation"]["Collective name"] for r in recorded][-len(rows.read(made[0])):]
    one = rows.read(made[0])
    names = [one.collectives[c] for c in one.columns["collective"]]
    assert names == profiled and "_reduce_scatter_base" in names
    assert cli.main(["skew", "-q", "--json", str(tmp_path)]) == 0
    said = json.loads(capsys.readouterr().out)
    scattered = [i for i in said["instances"] if i["collective"] == "_reduce_scatter_base"]
    assert len(scattered) == names.count("_reduce_scatter_base") >= 2
    assert all(i["transfer_us"] is not None for i in scattered)  # (timed by gloo's ranges)


pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def test_fsdp2_with_the_agent_alone_writes_a_row_for_every_collective(tmp_path: Path) -> None:
    """Issue 50: ``AUTOANNOT=1`` alone (no record file, no ring) and a profiler: the rows
    written at export name every collective the profiled steps launched (the launches held in
    the profiler's window), counted by the job's own profiler ranges of gloo (before, "no
    rows written": nothing named them)."""
    results = run_job(fsdp2_steps, 2, tmp_path, (str(tmp_path),), record=None)
    skip_if_torch_cannot(results)
    assert not list(tmp_path.glob("*.jsonl"))
    for rank in range(2):
        trace = tmp_path / f"trace_rank{rank}.json"
        ranges = [e for e in json.loads(trace.read_text())["traceEvents"]
                  if str(e.get("name", "")).startswith("gloo:")]
        made = rows.read(rows.rows_beside(trace))
        names = [made.collectives[c] for c in made.columns["collective"]]
        assert len(names) == len(ranges) >= 8
        assert {"_allgather_base", "_reduce_scatter_base"} <= set(names)

"""The trace tool on real traces from 2 and 4 H200s (tests/data/gpu, made by tests/gpu/*.py):
every graphed NCCL kernel of every replay gets the args of the eager kernel of the same call."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import agent_hooks as hooks
import pytest
import verify_traces as verify

from autoannot import cli
from autoannot.describe import vocabulary as V
from autoannot.traces import files
from autoannot.traces.read import annotate as tracetool
from autoannot.traces.read import ledger as ledgers

DATA = Path(__file__).parent / "data" / "gpu"
SETS = {"graphs": (2, [7, 5]), "mesh": (4, [4]), "compile": (2, [8])}  # ranks, calls per body


def copy_set(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(DATA / name, target)
    return target


@pytest.mark.parametrize("name", sorted(SETS))
def test_graphed_kernels_read_like_eager_ones(name: str, tmp_path: Path, figures) -> None:
    world, sizes = SETS[name]
    folder = copy_set(name, tmp_path)
    total = matching = 0
    for rank in range(world):
        out = folder / f"annotated_rank{rank}.json"
        report = tracetool.annotate_file(folder / f"graph_rank{rank}.json", out)
        assert not report.mismatches
        assert report.kernels_annotated == report.kernels_expected > 0
        eager = verify.eager_calls(folder / f"eager_rank{rank}.json")
        result = verify.compare(out, verify.split_bodies(eager, sizes))
        assert result["problems"] == []
        total += result["kernels"]
        matching += result["kernels_matching"]
    figures[f"graphed NCCL kernels with eager args ({name}, {world} ranks)"] = (
        f"{matching}/{total}")
    assert matching == total


PATTERNS = ("ddp", "graphed", "compiled", "mixed", "threads", "inference")
#: Graph launches a pattern profiled, where not 3 per body (inference: 2 decode steps per size).
REPLAYS = {"inference": 6}


def test_graphed_training_patterns_read_like_eager(tmp_path: Path, figures) -> None:
    """tests/gpu/training_patterns.py on 2 x H200: DDP whole-step capture (the reducer's
    all-reduces from autograd's device thread), make_graphed_callables forward and backward,
    torch.compile reduce-overhead forward and backward, a graph of Python-API and C++-origin
    collectives, two captures at once on two threads, inference with a graph per batch size
    sharing a pool: every NCCL kernel of every replay
    carries the eager kernel args of the same call."""
    total = matching = 0
    for name in PATTERNS:
        folder = copy_set(f"patterns/{name}", tmp_path)
        sizes = json.loads((folder / "meta.json").read_text())["sizes"]
        for rank in range(2):
            out = folder / f"annotated_rank{rank}.json"
            report = tracetool.annotate_file(folder / f"graph_rank{rank}.json", out)
            assert not report.mismatches, (name, report.mismatches)
            assert report.kernels_annotated == report.kernels_expected > 0
            eager = verify.eager_calls(folder / f"eager_rank{rank}.json")
            result = verify.compare(out, verify.split_bodies(eager, sizes), skip_empty=True)
            assert result["problems"] == [], (name, rank, result["problems"])
            assert result["replays"] == REPLAYS.get(name, 3 * len(sizes))
            total += result["kernels"]
            matching += result["kernels_matching"]
    figures["graphed NCCL kernels with eager args (training patterns: "
            f"{', '.join(PATTERNS)}; 2 ranks)"] = f"{matching}/{total}"
    assert matching == total


def test_annotated_kernels_stay_where_they_ran(tmp_path: Path) -> None:
    """By default only the collective args are added: every event keeps its stream, tid,
    timing and flows, every other event is unchanged (stream-based analyses see the same)."""
    folder = copy_set("graphs", tmp_path)
    tracetool.annotate_file(folder / "graph_rank0.json", folder / "out.json")
    raw = json.loads((folder / "graph_rank0.json").read_text())
    out = json.loads((folder / "out.json").read_text())
    assert out.pop(files.MARKER) == {"from": "graph_rank0.json", "ledger": "graph_rank0.autoannot",
                                     "annotated": 36}  # the one key added: what it came from
    assert {k: v for k, v in out.items() if k != "traceEvents"} == {
        k: v for k, v in raw.items() if k != "traceEvents"}
    assert len(out["traceEvents"]) == len(raw["traceEvents"])
    added = 0
    for before, after in zip(raw["traceEvents"], out["traceEvents"], strict=True):
        if V.COLLECTIVE_NAME in after.get("args", {}) and before != after:
            extra = {k: v for k, v in after["args"].items() if k not in before["args"]}
            assert set(extra) <= set(V.KERNEL_KEYS) and V.NAME not in extra
            assert {**after, "args": before["args"]} == before  # nothing else moved
            assert isinstance(extra[V.IN_NELEMS], int) and isinstance(extra[V.PG_RANKS], str)
            added += 1
        else:
            assert after == before
    assert added == 36


def test_lanes_put_each_group_on_its_own_row(tmp_path: Path) -> None:
    """``--lanes``: annotated kernels (and their flow ends) move to their group's lane."""
    folder = copy_set("graphs", tmp_path)
    tracetool.annotate_file(folder / "graph_rank0.json", folder / "out.json", lanes=True)
    doc = json.loads((folder / "out.json").read_text())
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"
               and V.COLLECTIVE_NAME in e.get("args", {})]
    lanes = {}
    for k in kernels:
        args = k["args"]
        assert isinstance(args[V.IN_NELEMS], int) and isinstance(args[V.GROUP_SIZE], int)
        assert isinstance(args[V.PG_RANKS], str)
        assert k["tid"] == args["stream"] >= V.FIRST_LANE
        lanes.setdefault(args[V.PG_NAME], set()).add(k["tid"])
    assert all(len(tids) == 1 for tids in lanes.values()) and len(lanes) == 2
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    for group, (tid,) in lanes.items():
        assert f"(pg {group})" in names[tid]
    flows = {(e["ts"]): e["tid"] for e in doc["traceEvents"]
             if e.get("cat") == "ac2g" and e.get("ph") == "f"}
    assert all(flows[k["ts"]] == k["tid"] for k in kernels)  # flow arrows follow the kernels
    raw = (folder / "out.json").read_text()
    assert '"distributedInfo"' in raw and '"rank": 0' in raw  # what HTA reads


def test_a_kernel_that_fits_no_capture_is_reported_not_guessed(tmp_path: Path) -> None:
    folder = copy_set("graphs", tmp_path)
    ledger_file = folder / "graph_rank0.autoannot"
    ledger = json.loads(ledger_file.read_text())
    entry = ledger["graphs"]["autoannot.graph.0"][3]
    assert entry["annotation"][V.COLLECTIVE_NAME] == "_reduce_scatter_base"
    entry["kernels"] = ["Broadcast"]  # the ledger now disagrees with the kernel that ran
    ledger_file.write_text(json.dumps(ledger))
    report = tracetool.annotate_file(folder / "graph_rank0.json", folder / "out.json")
    assert len(report.mismatches) == 3  # the 3 replays of graph 0
    assert "ReduceScatter" in report.mismatches[0]
    assert report.kernels_annotated == 3 * 5  # graph 1's replays only
    code = cli.main(["annotate", str(folder / "graph_rank0.json"), "-o",
                     str(folder / "cli.json")])
    assert code == 1


def test_compact_json_and_gzip_give_the_same_result(tmp_path: Path) -> None:
    folder = copy_set("graphs", tmp_path)
    tracetool.annotate_file(folder / "graph_rank1.json", folder / "kineto.json")
    compact = folder / "compact.json"
    compact.write_text(json.dumps(json.loads((folder / "graph_rank1.json").read_text())))
    shutil.copy(folder / "graph_rank1.autoannot", folder / "compact.autoannot")
    tracetool.annotate_file(compact, folder / "compact_out.json.gz")
    with gzip.open(folder / "compact_out.json.gz", "rt") as f:
        from_compact = json.load(f)
    from_kineto = json.loads((folder / "kineto.json").read_text())
    assert from_compact.pop(files.MARKER)["from"] == "compact.json"
    assert from_kineto.pop(files.MARKER)["from"] == "graph_rank1.json"
    assert from_compact == from_kineto


def test_cli_outputs_and_exit_codes(tmp_path: Path, capsys) -> None:
    folder = copy_set("graphs", tmp_path)
    traces = [str(folder / f"graph_rank{r}.json") for r in range(2)]
    assert cli.main(["annotate", *traces, "-o", str(tmp_path / "outdir")]) == 0
    assert sorted(p.name for p in (tmp_path / "outdir").iterdir()) == [
        "graph_rank0.json", "graph_rank1.json"]
    assert "36/36 graphed NCCL kernels annotated in 6 replays" in capsys.readouterr().out
    assert cli.main(["annotate", traces[0]]) == 0
    assert (folder / "annotated" / "graph_rank0.json").exists()
    capsys.readouterr()
    assert cli.main(["annotate", traces[0], "--json", "-o", str(tmp_path / "a.json")]) == 0
    assert json.loads(capsys.readouterr().out)[0]["kernels_annotated"] == 36
    with pytest.raises(SystemExit) as exc:
        cli.main(["annotate", "--help"])
    assert exc.value.code == 0


def test_traces_annotated_inside_the_job_match_eager(figures) -> None:
    """AUTOANNOT_ANNOTATE_ON_EXPORT=1 on the GPU machine: each rank annotated its own trace
    as the profiler exported it (tests/gpu/graph_replay.py, "inline" traces)."""
    total = matching = 0
    for rank in range(2):
        eager = verify.eager_calls(DATA / "graphs" / f"eager_rank{rank}.json")
        result = verify.compare(DATA / "graphs" / f"inline_rank{rank}.json",
                                verify.split_bodies(eager, SETS["graphs"][1]))
        assert result["problems"] == []
        total += result["kernels"]
        matching += result["kernels_matching"]
    figures["graphed NCCL kernels annotated inside the job (2 ranks)"] = f"{matching}/{total}"
    assert matching == total == 72


def test_export_hook_annotates_in_place_on_the_cpu(agent, monkeypatch, tmp_path: Path) -> None:
    import torch

    from autoannot.keep.ledgers import Ledger

    ledger = Ledger("autoannot.graph.cpu")
    monkeypatch.setitem(hooks.LEDGERS, ledger.name, ledger)
    monkeypatch.setenv("AUTOANNOT_ANNOTATE_ON_EXPORT", "1")
    with torch.profiler.profile() as prof:
        torch.ones(3).sum()
    trace = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(trace))
    assert Path(ledgers.ledger_path(trace)).exists()
    # Nothing a folder loader takes for a trace: HTA loads every *.json / *.gz of a folder
    # (a file without "rank" becomes rank 0), TensorBoard every *.pt.trace.json.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.autoannot", "cpu.json"]
    doc = json.loads(trace.read_text())  # rewritten in place, still a valid trace
    assert any(e.get("name") == "aten::sum" for e in doc["traceEvents"])
    assert not list(tmp_path.glob(".autoannot-*"))  # no temporary file left behind


def test_ledgers_of_earlier_versions_are_still_read(tmp_path: Path) -> None:
    """A ledger under its earlier name (NAME.autoannot.json, before 0.2) is found next to the
    trace without --ledger."""
    folder = copy_set("graphs", tmp_path)
    (folder / "graph_rank0.autoannot").rename(folder / "graph_rank0.autoannot.json")
    report = tracetool.annotate_file(folder / "graph_rank0.json", folder / "out.json")
    assert report.kernels_annotated == 36

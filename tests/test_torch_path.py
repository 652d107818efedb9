"""torch's own path (mark_kernels + cudaGraphNodeGetToolsId), exercised with torch's real module
where it imports (torch.cuda._graph_annotations in 2.12-2.13, torch.cuda.graph_annotations from
2.14). No machine here has the CUDA 13.1 driver the toolsId call needs: these tests check that
the agent enters torch's real ``mark_kernels`` during captures, turns ``enable_annotations`` on,
saves torch's annotation map in the ledger, and that the trace tool merges a toolsId map."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import agent_hooks as hooks
import pytest
import torch
import torch.distributed as dist

import autoannot
from autoannot.base import features
from autoannot.describe import vocabulary as V
from autoannot.keep.ledgers import Ledger
from autoannot.traces.read import annotate as tracetool
from autoannot.traces.read import ledger as ledgers

API = features.graph_annotations()
needs_torch_annotations = pytest.mark.skipif(
    API is None, reason="this torch has no graph annotations (torch < 2.12)")


def test_feature_detection_finds_each_piece_where_this_torch_keeps_it() -> None:
    """mark_kernels from the public module where it exists (2.14+), the state (whether
    annotations are on, the toolsId probe, get_stream_for_pg, the recorded map) from the
    private one where it exists; doctor says which."""
    import importlib.util

    from autoannot.agent import doctor

    shipped = [name for name in features.GRAPH_ANNOTATION_MODULES
               if importlib.util.find_spec(name) is not None]
    assert (API is not None) == bool(shipped)
    if API is None:
        return
    assert API.api.__name__ == shipped[0] and callable(API.mark_kernels)
    assert hasattr(API.state, "_annotations_enabled")
    if features.PRIVATE_MODULE in shipped:
        assert API.state.__name__ == features.PRIVATE_MODULE
    assert API.tools_id_unavailable() in (True, False)
    assert API.get_stream_for_pg is not None and API.get_stream_for_pg("0") >= V.FIRST_LANE
    assert isinstance(API.recorded(), dict)
    assert doctor.diagnose()["torch_annotation_module"] == API.where


@needs_torch_annotations
@pytest.mark.parametrize("annotations_on", [True, False])
@pytest.mark.parametrize("tools_id", [True, False])
def test_mark_kernels_is_entered_exactly_when_it_would_record(
        fake_world, agent, monkeypatch, annotations_on: bool, tools_id: bool) -> None:
    import contextlib

    entered = []

    def spy(annotation):  # the real one would call the CUDA driver, absent here
        entered.append(dict(annotation))
        return contextlib.nullcontext()

    monkeypatch.setattr(API.api, "mark_kernels", spy)
    monkeypatch.setattr(API.state, "_annotations_enabled", annotations_on)
    asked = []

    def probe() -> bool:
        asked.append(1)
        return not tools_id

    monkeypatch.setattr(API.state, "_is_tools_id_unavailable", probe, raising=False)
    from autoannot import testing

    dist.all_reduce(torch.ones(4))
    assert entered == []  # no capture: torch's context is never entered
    hooks.AGENT.captures.by_thread()  # (a stand-in capture is the thread's)
    with testing.stand_in(), autoannot.record() as records:  # CUDAGraph's wrappers
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(8))
    expected = [r.annotation for r in records] if annotations_on and tools_id else []
    assert len(records) == 2 and entered == expected
    assert len(asked) == (1 if annotations_on else 0)  # once a capture, not once a launch


@needs_torch_annotations
@pytest.mark.parametrize("tools_id", [True, False])
def test_capture_turns_torchs_annotations_on_where_they_work(agent, monkeypatch,
                                                             tools_id: bool) -> None:
    graphs = torch.cuda.graphs
    monkeypatch.setattr(features, "_has_gpu", lambda: True)  # as on a GPU machine
    monkeypatch.setattr(API.state, "_is_tools_id_unavailable", lambda: not tools_id,
                        raising=False)
    assert graphs.graph(None, stream="s")._enable_annotations == tools_id
    assert not graphs.graph(None, stream="s", enable_annotations=False)._enable_annotations
    monkeypatch.setenv("AUTOANNOT_TORCH_ANNOTATIONS", "0")  # read when the agent is enabled
    autoannot.disable()
    autoannot.enable()
    assert not graphs.graph(None, stream="s")._enable_annotations


@needs_torch_annotations
def test_no_gpu_no_torch_annotations(agent) -> None:
    """Where torch's probe says yes without a GPU (cuda-bindings installed), nothing is
    forced on: this machine has no GPU."""
    assert not features.tools_id_usable()
    assert not torch.cuda.graphs.graph(None, stream="s")._enable_annotations


@needs_torch_annotations
def test_exported_trace_gets_a_ledger_with_torchs_annotation_map(
        agent, monkeypatch, tmp_path: Path) -> None:
    tools_id = (7 << 32) | 3
    # torch's registry, written as the installed torch writes it (2.15: per graph, one
    # merged dict per node; up to 2.14: a dict of lists)
    merge = getattr(API.state, "_merge_annotation", None)
    if merge is not None:
        merge(tools_id, {"name": "x"})
    else:
        monkeypatch.setitem(API.state._kernel_annotations, tools_id, [{"name": "x"}])
    monkeypatch.setitem(hooks.LEDGERS, "autoannot.graph.test", Ledger("g"))
    try:
        with torch.profiler.profile() as prof:
            torch.ones(3).sum()
        trace = tmp_path / "trace.json"
        prof.export_chrome_trace(str(trace))
    finally:
        if merge is not None:
            API.api.clear_kernel_annotations()
    ledger = json.loads(Path(ledgers.ledger_path(trace)).read_text())
    assert ledger["tools_id"] == {str(tools_id): [{"name": "x"}]}
    assert "autoannot.graph.test" in ledger["graphs"]
    assert oct(Path(ledgers.ledger_path(trace)).stat().st_mode & 0o777) == oct(trace.stat(
    ).st_mode & 0o777)


def test_tool_merges_a_tools_id_map_with_json_types(tmp_path: Path) -> None:
    """Kernels that carry "graph node id" (a CUDA 13.1 driver) are annotated from the ledger's
    toolsId map: built here from a real trace and the eager args of the same calls."""
    import verify_traces as verify

    source = Path(__file__).parent / "data" / "gpu" / "graphs"
    eager = verify.eager_calls(source / "eager_rank0.json")
    doc = json.loads((source / "graph_rank0.json").read_text())
    bodies = verify.split_bodies(eager, [7, 5])
    tools_map = {}
    for n, kernels in enumerate(verify.replays(source / "graph_rank0.json")):
        body = bodies[n % 2]
        for k, kernel in enumerate(kernels):
            node = ((n % 2 + 1) << 32) | (k + 1)
            for event in doc["traceEvents"]:
                if event is kernel or (event.get("ts") == kernel["ts"]
                                       and event.get("name") == kernel["name"]):
                    event["args"]["graph node id"] = node
            tools_map[str(node)] = [{**body[k], "name": "c", "stream": 60 + n % 2}]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(doc))
    ledger = {"format": ledgers.FORMAT, "version": 1, "rank": 0, "graphs": {},
              "tools_id": tools_map}
    (tmp_path / "t.autoannot.json").write_text(json.dumps(ledger))
    report = tracetool.annotate_file(trace, tmp_path / "out.json")
    assert report.by_tools_id == report.kernels_annotated == 36
    result = verify.compare(tmp_path / "out.json", bodies)
    assert result["problems"] == [] and result["kernels_matching"] == 36
    out = json.loads((tmp_path / "out.json").read_text())
    sample = next(e for e in out["traceEvents"] if V.IN_NELEMS in e.get("args", {}))
    assert isinstance(sample["args"][V.IN_NELEMS], int)  # torch's own tool writes strings
    shutil.rmtree(tmp_path, ignore_errors=True)

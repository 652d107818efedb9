"""Annotated traces in the tools people analyse them with: HolisticTraceAnalysis, torch's trace
validator, Perfetto (decoded with the official protos the ``perfetto`` package ships) and
TensorBoard's profiler plugin — on the real graph-replay traces from 2 and 4 H200s.

Each tool must read an annotated trace as it reads the raw one (the same kernel breakdown, idle
time, user-annotation attribution, kernel statistics), plus the collective args.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

from autoannot.describe import vocabulary as V
from autoannot.traces.read import annotate
from autoannot.traces.read import ledger as ledgers

DATA = Path(__file__).parent / "data" / "gpu"

SETS = {"graphs": 2, "mesh": 4}  # 2 and 4 ranks


def agent_folders(name: str, tmp_path: Path) -> dict[str, Path]:
    """Folders as the agent leaves them, raw and annotated: ``graph_rank<r>.json`` and its
    ledger ``graph_rank<r>.autoannot`` side by side (the 4-GPU mesh set keeps its ledgers under
    their earlier name, which the trace tool still reads)."""
    folders = {kind: tmp_path / name / kind for kind in ("raw", "annotated")}
    for folder in folders.values():
        folder.mkdir(parents=True)
    for rank in range(SETS[name]):
        trace = DATA / name / f"graph_rank{rank}.json"
        ledger = ledgers.find(trace)
        shutil.copy(trace, folders["raw"] / trace.name)
        annotate.annotate_file(trace, folders["annotated"] / trace.name, ledger)
        for folder in folders.values():
            shutil.copy(ledger, folder / f"graph_rank{rank}.autoannot")
    return folders


@pytest.fixture(scope="module")
def hta() -> Any:
    warnings.simplefilter("ignore", FutureWarning)  # pandas deprecations inside HTA
    logging.getLogger("hta").setLevel(logging.WARNING)
    from hta.configs.parser_config import ParserConfig
    from hta.trace_analysis import TraceAnalysis

    ParserConfig.enable_communication_args()
    return TraceAnalysis


def _attributed(analysis: Any, rank: int) -> int | str:
    """How many kernels HTA attributes to a user annotation (the replay markers), or the error
    HTA itself raises: on the graphs set's rank 1, raw or not, pandas rejects an interval
    HTA builds ("left side of interval must be <= right side")."""
    try:
        frame = analysis.get_gpu_kernels_with_user_annotations(rank)
    except ValueError as exc:
        return f"HTA raised ValueError: {exc}"
    return int((frame["user_annotation"] >= 0).sum())


def _hta_view(analysis: Any, world: int) -> dict[str, Any]:
    kernels = analysis.get_gpu_kernel_breakdown(visualize=False)
    idle = analysis.get_idle_time_breakdown(visualize=False)[0]
    attributed = [_attributed(analysis, rank) for rank in range(world)]
    return {"kernels": kernels, "idle": idle, "attributed": attributed}


@pytest.mark.parametrize("name", sorted(SETS))
def test_hta_reads_annotated_folders_like_raw_ones(name: str, tmp_path: Path, hta, figures
                                                   ) -> None:
    world = SETS[name]
    folders = agent_folders(name, tmp_path)
    views, collectives = {}, 0
    for kind, folder in folders.items():
        analysis = hta(trace_dir=str(folder))  # ledgers present: none is taken for a trace
        assert sorted(analysis.t.traces) == list(range(world))
        views[kind] = _hta_view(analysis, world)
        if kind == "annotated":
            for rank in range(world):
                frame = analysis.t.get_trace(rank)
                rows = frame[frame["collective_name"].astype(str) != ""]
                assert len(rows) > 0 and str(rows["in_msg_nelems"].dtype).startswith("int")
                assert (rows["group_size"] == 2).all()
                collectives += len(rows)
    raw, annotated = views["raw"], views["annotated"]
    assert all(a.equals(b) for a, b in zip(raw["kernels"], annotated["kernels"], strict=True))
    assert raw["idle"].equals(annotated["idle"])
    assert raw["attributed"] == annotated["attributed"]
    counted = [n for n in annotated["attributed"] if isinstance(n, int)]
    assert sum(counted) > 0
    figures[f"HTA on the annotated {name} folder ({world} ranks)"] = (
        f"{collectives} collective rows read; kernel breakdown, idle time, user-annotation "
        f"attribution ({sum(counted)} kernels on {len(counted)} ranks) as on the raw traces")


@pytest.mark.parametrize("name", sorted(SETS))
def test_torch_trace_validator_passes(name: str, tmp_path: Path) -> None:
    validator = pytest.importorskip("torch.profiler._trace_validator",
                                    reason="this torch has no trace validator (added in 2.13)")
    folders = agent_folders(name, tmp_path)
    for rank in range(SETS[name]):
        passed, violations = validator.validate_trace(
            str(folders["annotated"] / f"graph_rank{rank}.json"))
        assert passed, violations


def test_tensorboard_plugin_reads_annotated_traces_like_raw_ones(tmp_path: Path) -> None:
    from torch_tb_profiler.profiler.data import RunProfileData

    stats = {}
    for kind in ("raw", "annotated"):
        path = tmp_path / kind / "worker0.1.pt.trace.json"  # the plugin's file name pattern
        path.parent.mkdir()
        trace = DATA / "graphs" / "graph_rank0.json"
        if kind == "raw":
            shutil.copy(trace, path)
        else:
            annotate.annotate_file(trace, path, DATA / "graphs" / "graph_rank0.autoannot")
        data = RunProfileData.parse("worker0", "1", str(path), str(tmp_path / "cache"))
        data.process()
        stats[kind] = data.kernel_stat
        assert data.has_kernel
    assert stats["raw"].equals(stats["annotated"])


# --- Perfetto ----------------------------------------------------------------------------------

def _decode(path: Path) -> Any:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2

    return perfetto_trace_pb2.Trace.FromString(path.read_bytes())


@pytest.mark.parametrize("name", sorted(SETS))
def test_perfetto_output_is_a_valid_trace(name: str, tmp_path: Path) -> None:
    """One process per pid (no two share a pid, none has pid 0), GPUs named after Kineto's
    labels, every track named, slices nested per track, every flow kept, packets in order:
    the descriptors, then the events by time."""
    from autoannot import cli

    for rank in range(SETS[name]):
        raw_path = DATA / name / f"graph_rank{rank}.json"
        out = tmp_path / f"rank{rank}.pftrace"
        ledger = ledgers.find(raw_path)
        assert cli.main(["annotate", str(raw_path), "--ledger", str(ledger), "-o", str(out)]) == 0
        trace = _decode(out)
        packets = list(trace.packet)
        kinds = ["event" if p.HasField("track_event") else "track"
                 for p in packets if p.HasField("track_event") or p.HasField("track_descriptor")]
        assert kinds == sorted(kinds, key=lambda k: k == "event")  # descriptors first
        events = [p for p in packets if p.HasField("track_event")]
        assert [p.timestamp for p in events] == sorted(p.timestamp for p in events)

        tracks = {p.track_descriptor.uuid: p.track_descriptor for p in packets
                  if p.HasField("track_descriptor")}
        processes = {uuid: t.process for uuid, t in tracks.items() if t.HasField("process")}
        pids = [p.pid for p in processes.values()]
        assert len(pids) == len(set(pids)) and 0 not in pids
        names = sorted(p.process_name for p in processes.values())
        raw = json.loads(raw_path.read_text())["traceEvents"]
        host = next(e["args"]["name"] for e in raw  # Kineto's name of the host process
                    if e.get("ph") == "M" and e.get("name") == "process_name"
                    and not isinstance(e.get("pid"), str) and e.get("pid", 0) > 0
                    and not e["args"]["name"].startswith("GPU"))
        assert names == [f"GPU {rank} (rank {rank})", f"{host} (rank {rank})"]
        for uuid, track in tracks.items():
            if uuid not in processes:
                assert track.name and track.parent_uuid in processes
        gpu = next(u for u, p in processes.items() if p.process_name.startswith("GPU"))
        streams = {t.name for t in tracks.values() if t.parent_uuid == gpu}
        assert streams and all(s.startswith("stream ") for s in streams)

        open_slices: dict[int, int] = {}
        for packet in events:  # begin/end nest on every track
            event = packet.track_event
            if event.type == event.TYPE_SLICE_BEGIN:
                open_slices[event.track_uuid] = open_slices.get(event.track_uuid, 0) + 1
            elif event.type == event.TYPE_SLICE_END:
                assert open_slices.get(event.track_uuid, 0) > 0
                open_slices[event.track_uuid] -= 1
        assert not any(open_slices.values())

        raw = json.loads(raw_path.read_text())["traceEvents"]
        starts = {e["id"] for e in raw if e.get("ph") == "s"}
        expected_flows = sum(1 for e in raw if e.get("ph") == "f" and e["id"] in starts)
        started = [f for p in events for f in p.track_event.flow_ids]
        ended = [f for p in events for f in p.track_event.terminating_flow_ids]
        assert sorted(started) == sorted(ended) and len(ended) == expected_flows > 0

        annotated = [p.track_event for p in events
                     if any(a.name == V.COLLECTIVE_NAME for a in p.track_event.debug_annotations)]
        assert annotated
        for event in annotated:
            args = {a.name: a for a in event.debug_annotations}
            assert args[V.IN_NELEMS].HasField("int_value")
            assert args[V.DTYPE].HasField("string_value")
            assert tracks[event.track_uuid].name.startswith("stream ")  # where they ran


def _critical_path(hta: Any, folder: Path, steps: int) -> list[Any]:
    """HTA's critical path of each profiled step on rank 0: its summary (share of the step by
    boundedness) and its nodes."""
    analysis = hta(trace_dir=str(folder))
    paths = []
    for step in range(steps):
        graph, ok = analysis.critical_path_analysis(rank=0, annotation="ProfilerStep",
                                                    instance_id=step)
        assert ok, (folder.name, step)
        paths.append((graph.summary().round(9).to_dict(), len(graph.critical_path_nodes)))
    return paths


def test_hta_critical_path_is_the_same_on_annotated_traces(tmp_path: Path, hta, figures
                                                           ) -> None:
    """The inference pattern's whole traces (a graph per batch size, profiled step by step with
    CUDA sync events): HTA's critical path of every step, raw and annotated (in place, and
    with lanes)."""
    source = DATA / "patterns" / "inference"
    steps = len(json.loads((source / "meta.json").read_text())["sizes"]) * 2
    paths = {}
    for kind in ("raw", "annotated", "lanes"):
        folder = tmp_path / kind
        folder.mkdir()
        for rank in range(2):
            trace = source / f"full_rank{rank}.json"
            if kind == "raw":
                shutil.copy(trace, folder / trace.name)
            else:
                report = annotate.annotate_file(trace, folder / trace.name,
                                                source / f"full_rank{rank}.autoannot",
                                                lanes=kind == "lanes")
                assert report.kernels_annotated == report.kernels_expected > 0
        paths[kind] = _critical_path(hta, folder, steps)
    assert paths["annotated"] == paths["raw"]
    communication = [summary.get("gpu_communication_bound", 0) for summary, _ in paths["raw"]]
    assert any(share > 0 for share in communication)  # the graphed NCCL kernels are on it
    # With lanes, HTA finds no launch queue on a lane's stream and leaves the moved kernels off
    # the path (the README's trade-off: the default keeps the path).
    nodes = {kind: sum(n for _, n in paths[kind]) for kind in paths}
    assert nodes["lanes"] < nodes["raw"]
    figures["HTA critical path (inference, rank 0): raw = annotated"] = (
        f"{steps} steps, {nodes['raw']} path nodes, communication-bound "
        f"{min(communication):.3f}-{max(communication):.3f}% of each step; with --lanes "
        f"{nodes['lanes']} nodes (the moved kernels off the path)")

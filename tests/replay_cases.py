"""Rank bodies of the ring's graph-replay tests (``test_ring_replays.py``), run in real gloo
processes: a graph captured on a stand-in ``CUDAGraph`` class (no CUDA here; the agent's own
wrappers put on it by ``graph_patches.install``), replayed step after step with the always-on
ring open."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import autoannot


def _graphs_module() -> types.ModuleType:
    """A ``torch.cuda.graphs`` stand-in: a graph class whose replay takes a known time and
    raises when told to (``fail``)."""

    class CUDAGraph:
        fail = False

        def capture_begin(self) -> None:
            pass

        def capture_end(self) -> None:
            pass

        def replay(self) -> None:
            time.sleep(0.002)
            if self.fail:
                raise RuntimeError("replay failed (planted)")

    module = types.ModuleType("stand_in_graphs")
    module.CUDAGraph = CUDAGraph  # type: ignore[attr-defined]
    return module


def _line_below() -> int:
    """The line after the caller's: where the call the test plants is."""
    return sys._getframe(1).f_lineno + 1


def replayed_steps(rank: int, world: int, folder: str, late_rank: int, late_s: float,
                   steps: int) -> dict[str, Any]:
    """The ring opened before ``enable()`` (as ``AUTOANNOT_RING`` opens it); a graph of three
    collectives on two groups captured; then ``steps`` steps, each a replay of the graph and
    an eager all-reduce of a scalar on a third group (what keeps the ranks in step, as a
    graph's collectives would on a GPU), rank ``late_rank`` sleeping ``late_s`` before each
    replay (-1: none);
    last, a replay that raises. The ring's records are read back, with the times around each
    replay and whether the replay wrapper was on."""
    from autoannot.agent import graph_patches
    from autoannot.agent.instrumentation import INSTRUMENTATION as agent
    from autoannot.keep.ring import Ring
    from autoannot.traces.read import ring_files

    ring = Ring(folder)
    agent.state.open_journal(ring)
    agent.captures.by_thread()  # (no CUDA: a launch is in the capture of its thread)
    autoannot.enable()
    graphs = _graphs_module()
    original = graphs.CUDAGraph.__dict__["replay"]
    patches = graph_patches.install(graphs, agent)
    wrapped_while_open = graphs.CUDAGraph.__dict__["replay"] is not original
    sub = dist.new_group(list(range(world)))
    sync = dist.new_group(list(range(world)))  # (the eager launches': none of the graph's)
    x = torch.ones(2, 8) + rank
    graph = graphs.CUDAGraph()
    lines: list[int] = []
    graph.capture_begin()
    lines.append(_line_below())
    dist.all_reduce(x)
    lines.append(_line_below())
    dist.all_gather_into_tensor(torch.empty(2 * world, 8), x)
    lines.append(_line_below())
    dist.all_reduce(torch.ones(3, dtype=torch.float64), group=sub)
    graph.capture_end()
    around: list[list[int]] = []
    writer_at_replays: list[bool] = []
    for _ in range(steps):
        if rank == late_rank:
            time.sleep(late_s)
        before = time.monotonic_ns()
        graph.replay()
        around.append([before, time.monotonic_ns()])
        writer_at_replays.append(ring.writer is not None)
        lines.append(_line_below())
        dist.all_reduce(torch.ones(1), group=sync)
    graph.fail = True
    before = time.monotonic_ns()
    try:
        graph.replay()
        raised = None
    except RuntimeError as exc:
        raised = str(exc)
    around.append([before, time.monotonic_ns()])
    path = ring.ring_path
    agent.state.close_journal(ring)
    unwrapped_once_closed = graphs.CUDAGraph.__dict__["replay"] is original
    ring.close()
    autoannot.disable()
    for patch in reversed(patches):
        patch.undo()
    read = ring_files.read(Path(path))
    kinds = [read.kinds[int(k)] for k in read.records["kind"]]
    return {
        "lines": lines, "file": __file__, "raised": raised, "around": around,
        "graph": getattr(graph, "_autoannot_graph", None),
        "wrapped_while_open": wrapped_while_open, "unwrapped_once_closed": unwrapped_once_closed,
        "restored": graphs.CUDAGraph.__dict__["replay"] is original,
        "writer_at_replays": writer_at_replays,
        "world_group": dist.distributed_c10d._get_process_group_name(dist.group.WORLD),
        "sub": dist.distributed_c10d._get_process_group_name(sub),
        "sync": dist.distributed_c10d._get_process_group_name(sync),
        "launches": [(launch.group, launch.seq, launch.collective, launch.size_bytes,
                      launch.call_site) for launch in ring_files.launches_of(read)],
        "graphs": [kind.get("graph") for kind in kinds],
        "entered": [int(e) for e in read.records["entered_ns"]],
        "returned": [int(r) for r in read.records["returned_ns"]],
    }

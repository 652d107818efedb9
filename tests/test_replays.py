"""Replays: no frame of the agent's on ``CUDAGraph.replay`` while no profiler records; each
replay of a graph with a ledger marked in the trace while one does (torch's real profiler on
this CPU; a stand-in graph class: this machine has no CUDA)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from typing import Any

import agent_hooks as hooks
import pytest
import torch

import autoannot
from autoannot.agent import graph_patches
from autoannot.traces.names import REPLAY_PREFIX


def _graphs_module() -> types.ModuleType:
    """A ``torch.cuda.graphs`` stand-in: a graph class whose methods run on a CPU."""

    class CUDAGraph:
        replays = 0

        def capture_begin(self) -> None:
            pass

        def capture_end(self) -> None:
            pass

        def replay(self) -> None:
            type(self).replays += 1
            torch.ones(2).sum()  # (an op, as a replay's launch is one in the trace)

    module = types.ModuleType("stand_in_graphs")
    module.CUDAGraph = CUDAGraph
    return module


#: A torch whose profilers give no start/stop notice keeps the replay wrapper for good (as
#: before): the switching cannot be checked there.
needs_notices = pytest.mark.skipif(
    not all(callable(getattr(torch.autograd.profiler, name, None))
            for name in ("_run_on_profiler_start", "_run_on_profiler_stop")),
    reason="this torch's profilers give no start/stop notice (torch.autograd.profiler."
           "_run_on_profiler_start)")


@pytest.fixture(autouse=True)
def no_on_demand_tracing(monkeypatch) -> None:
    """(A developer's KINETO_USE_DAEMON would keep the wrapper on in this process.)"""
    monkeypatch.delenv(graph_patches.ON_DEMAND_SETTING, raising=False)


@pytest.fixture
def graphs(agent) -> Any:
    hooks.AGENT.captures.by_thread()
    module = _graphs_module()
    patches = graph_patches.install(module, hooks.AGENT)
    try:
        yield module
    finally:
        for patch in reversed(patches):
            patch.undo()


def _names(prof: Any) -> list[str]:
    events = prof.events() if hasattr(prof, "events") else prof.function_events
    return [event.name for event in events]


@needs_notices
def test_a_replay_runs_torchs_own_method_unless_a_profiler_records(graphs) -> None:
    original = graphs.CUDAGraph.__dict__["replay"]
    graph = graphs.CUDAGraph()
    graph.capture_begin()
    graph.capture_end()
    name = graph._autoannot_graph
    assert graphs.CUDAGraph.__dict__["replay"] is original  # no profiler: nothing of ours
    graph.replay()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert graphs.CUDAGraph.__dict__["replay"] is not original
        graph.replay()
    assert graphs.CUDAGraph.__dict__["replay"] is original  # off again at the stop
    assert _names(prof).count(REPLAY_PREFIX + name) == 1
    with torch.autograd.profiler.profile() as legacy:  # the other profiler object, too
        graph.replay()
    assert _names(legacy).count(REPLAY_PREFIX + name) == 1
    assert graphs.CUDAGraph.__dict__["replay"] is original
    assert graphs.CUDAGraph.replays == 3


@needs_notices
def test_a_profiler_recording_at_enable_gets_the_markers_and_disable_restores_all() -> None:
    import torch.autograd.profiler as notices

    start, stop = notices._run_on_profiler_start, notices._run_on_profiler_stop
    replay = torch.cuda.graphs.CUDAGraph.__dict__["replay"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        autoannot.enable()
        try:
            assert torch.cuda.graphs.CUDAGraph.__dict__["replay"] is not replay
        finally:
            autoannot.disable()
        assert torch.cuda.graphs.CUDAGraph.__dict__["replay"] is replay
    assert notices._run_on_profiler_start is start and notices._run_on_profiler_stop is stop
    assert torch.cuda.graphs.CUDAGraph.__dict__["replay"] is replay


@needs_notices
def test_profilers_after_disable_put_nothing_back(graphs) -> None:
    original = graphs.CUDAGraph.__dict__["replay"]
    autoannot.disable()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert torch.cuda.graphs.CUDAGraph.__dict__["replay"] is torch.cuda.graphs.CUDAGraph.replay
        assert not hooks.AGENT.proxies.is_proxy(torch.cuda.graphs.CUDAGraph.__dict__["replay"])
    assert graphs.CUDAGraph.__dict__["replay"] is original


ON_DEMAND = textwrap.dedent("""
    import torch, autoannot
    autoannot.enable()
    from autoannot.agent.instrumentation import INSTRUMENTATION as agent
    print(agent.proxies.is_proxy(torch.cuda.graphs.CUDAGraph.__dict__["replay"]))
""")


@needs_notices
@pytest.mark.parametrize("setting, wrapped", [("1", "True"), ("0", "False")])
def test_with_on_demand_tracing_configured_replays_stay_wrapped(setting: str,
                                                                wrapped: str) -> None:
    """Kineto's daemon starts a profiler with no Python notice: where it is configured the
    replay keeps its wrapper for the whole process."""
    env = {**os.environ, graph_patches.ON_DEMAND_SETTING: setting}
    done = subprocess.run([sys.executable, "-c", ON_DEMAND], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == wrapped


@needs_notices
def test_a_ring_keeps_replays_wrapped_through_a_profilers_start_and_stop(graphs,
                                                                       tmp_path) -> None:
    """While a ring that keeps replays is open, a profiler's stop leaves the replay wrapper on
    (the ring still needs it); the ring's close takes it off; a profiler's window (a ring held
    in memory) never asks for it."""
    from autoannot.keep.ring import Ring

    original = graphs.CUDAGraph.__dict__["replay"]
    state = hooks.AGENT.state
    window = Ring(None)
    state.open_journal(window)
    try:
        assert graphs.CUDAGraph.__dict__["replay"] is original
    finally:
        state.close_journal(window)
    ring = Ring(str(tmp_path / "rings"))
    state.open_journal(ring)
    try:
        assert graphs.CUDAGraph.__dict__["replay"] is not original
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            assert graphs.CUDAGraph.__dict__["replay"] is not original
        assert graphs.CUDAGraph.__dict__["replay"] is not original
    finally:
        state.close_journal(ring)
        ring.close()
    assert graphs.CUDAGraph.__dict__["replay"] is original
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert graphs.CUDAGraph.__dict__["replay"] is not original
    assert graphs.CUDAGraph.__dict__["replay"] is original

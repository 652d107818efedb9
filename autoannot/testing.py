"""Stand-ins for what tests and benchmarks cannot have on a machine with no GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def stand_in(test_capture: int = 0, agent: Any = None) -> Iterator[Any]:
    """A capture with no CUDA: the agent's ``CUDAGraph`` wrappers around a stand-in graph
    (yielded; its ledger is ``agent.captures.ledger_of(graph)``). Where the native observer is
    loaded, ``test_capture`` stands in for CUDA's capture id of every launch meanwhile (0: no
    launch is in a capture it knows of, as on a CPU)."""
    from autoannot.agent import graph_patches
    from autoannot.agent.instrumentation import INSTRUMENTATION

    agent = INSTRUMENTATION if agent is None else agent
    module = agent.observer.module if agent.observer is not None else None
    if module is not None:
        module.set_test_capture(test_capture)
    graph = type("Graph", (), {})()
    hooks = graph_patches.capture_hooks(agent.captures)
    hooks["capture_begin"](lambda: None, graph, (), {})
    try:
        yield graph
    finally:
        hooks["capture_end"](lambda: None, graph, (), {})
        if module is not None:
            module.set_test_capture(0)

"""The agent's parts as the tests reach them: the one ``Instrumentation`` and what its
``CUDAGraph`` wrappers do, called on stand-in graphs (no CUDA here)."""

from __future__ import annotations

from typing import Any

from autoannot.agent import graph_patches
from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT
from autoannot.keep import capture_identity

LEDGERS = AGENT.captures.ledgers


def _hook(name: str) -> Any:
    return graph_patches.capture_hooks(AGENT.captures)[name]


def begin_capture(begin: Any, graph: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
    """What ``CUDAGraph.capture_begin``'s wrapper does, around ``begin``."""
    return _hook("capture_begin")(begin, graph, args, kwargs or {})


def end_capture(end: Any, graph: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
    return _hook("capture_end")(end, graph, args, kwargs or {})


def replay(run: Any, graph: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
    return _hook("replay")(run, graph, args, kwargs or {})


def identity(way: Any) -> capture_identity.CaptureIdentity:
    """A capture identity asking ``way`` (ledgers and capturing threads: the agent's)."""
    captures = AGENT.captures
    return capture_identity.CaptureIdentity(captures.ledgers, captures.capturing, way)


def by_thread() -> capture_identity.CaptureIdentity:
    return identity(capture_identity.ByThread(AGENT.captures.capturing))


def ledger(graph: Any) -> Any:
    return LEDGERS[graph._autoannot_graph]


def group_hooks_observe() -> bool:
    """Whether rank processes started now observe launches below the Python API through
    torch's process-group hooks (torch >= 2.14, ``AUTOANNOT_GROUP_HOOKS`` not 0)."""
    import torch.distributed  # noqa: F401  (its C module: the hooks' feature test)

    from autoannot.base import config
    from autoannot.observe import group_hooks

    return group_hooks.observe(config.from_environment())

"""The agent's patches on torch's CUDA graphs (what ``keep.captures`` does, put on torch):

* ``CUDAGraph.capture_begin`` / ``capture_end`` are wrapped to count captures (the collective
  wrappers only read the count), to name each graph ``autoannot.graph.<n>`` and to start and
  stop the launch observers for it (``Captures.began`` / ``ended``);
* ``CUDAGraph.replay`` is wrapped while a profiler records, to mark each replay, and while a
  ring that keeps replays is open (``AUTOANNOT_RING``), to write each replay's launches to it
  (put on and taken off as these start and stop, so a replay with neither runs torch's own
  method);
* where torch's own path works (``mark_kernels`` + ``cudaGraphNodeGetToolsId``), every
  ``torch.cuda.graph`` capture gets ``enable_annotations=True`` unless the user said otherwise or
  ``AUTOANNOT_TORCH_ANNOTATIONS=0``.
"""

from __future__ import annotations

import inspect
import time
from types import ModuleType
from typing import Any

import wrapt

from autoannot.agent.patching import Patch, SwitchedPatch, wrap_attribute
from autoannot.base import features
from autoannot.base.ring_format import FAILED
from autoannot.keep import gpu_clock
from autoannot.keep.captures import Captures, said

monotonic_ns = time.monotonic_ns


def _verify(captures: Captures, graph: Any) -> None:
    """``AUTOANNOT_VERIFY=1``: compare the graph's collectives with the other ranks' now
    (``live.verify``); a difference raises ``SequenceMismatch`` (on purpose: the replay would
    hang); a failure of the comparison itself is said once, the capture stands."""
    from autoannot.live import verify

    ledger = captures.ledger_of(graph)
    if ledger is None:
        return
    try:
        verify.verify_capture(ledger.name, ledger.entries)
    except verify.SequenceMismatch:
        raise
    except Exception as exc:
        said("capture_end (AUTOANNOT_VERIFY)", exc)


def capture_hooks(captures: Captures) -> dict[str, Any]:
    """wrapt wrappers of ``CUDAGraph``'s methods, reporting to ``captures`` (what ``install``
    puts on the class; the stand-in capture and the tests call them on stand-in graphs)."""

    def capture_begin(wrapped: Any, graph: Any, args: tuple, kwargs: dict) -> Any:
        try:  # (the GPU clock's stamps made, and its thread stops looking, first)
            gpu_clock.capture_coming(captures.agent.state.journals)
        except Exception as exc:
            said("capture_begin (GPU times)", exc)
            gpu_clock.capture_coming()
        try:
            result = wrapped(*args, **kwargs)
        except BaseException:
            gpu_clock.capture_over()
            raise
        try:
            captures.began(graph)
        except Exception as exc:  # the capture goes on; its collectives may go unannotated
            said("capture_begin", exc)
        return result

    def capture_end(wrapped: Any, graph: Any, args: tuple, kwargs: dict) -> Any:
        try:  # (the GPU clock's stamps joined to the capture's stream first)
            gpu_clock.capture_ending(captures.agent.state.journals)
        except Exception as exc:
            said("capture_end (GPU times)", exc)
        try:
            result = wrapped(*args, **kwargs)
        finally:
            try:
                captures.ended(graph)
            except Exception as exc:
                said("capture_end", exc)
        if captures.agent.config.verify and captures.agent.state.live:
            _verify(captures, graph)
        return result

    def replay(wrapped: Any, graph: Any, args: tuple, kwargs: dict) -> Any:
        try:
            marker = captures.replay_marker(graph)
            kept = captures.replay_kept(graph)
        except Exception as exc:  # the replay runs, unmarked and unkept
            said("replay", exc)
            marker = kept = None
        if kept is None:
            if marker is None:
                return wrapped(*args, **kwargs)
            with marker:
                return wrapped(*args, **kwargs)
        entered = monotonic_ns()
        returned = FAILED
        try:
            if marker is None:
                result = wrapped(*args, **kwargs)
            else:
                with marker:
                    result = wrapped(*args, **kwargs)
            returned = monotonic_ns()
        finally:  # (its launches to the rings that keep replays: the route's)
            captures.agent.state.route.replayed(*kept, entered, returned)
        return result

    return {"capture_begin": capture_begin, "capture_end": capture_end, "replay": replay}


#: Kineto's on-demand tracing (dynolog) starts a profiler with no Python call: with it
#: configured, replays stay wrapped for the whole process.
ON_DEMAND_SETTING = "KINETO_USE_DAEMON"


def profiler_notices() -> ModuleType | None:
    """The module whose ``_run_on_profiler_start``/``_run_on_profiler_stop`` torch's profilers
    call at each start and stop (``torch.autograd.profiler``: it keeps its fast
    ``_is_profiler_enabled`` flag by them); None where this torch has none or on-demand
    tracing is configured (a profiler may start with no notice)."""
    import os
    import sys

    if os.environ.get(ON_DEMAND_SETTING, "") not in ("", "0"):
        return None
    module = sys.modules.get("torch.autograd.profiler")
    if module is None or not all(callable(getattr(module, name, None)) for name in
                                 ("_run_on_profiler_start", "_run_on_profiler_stop")):
        return None
    return module


def mark_replays_while_profiling(graph_class: Any, replay: Any, agent: Any) -> list[Patch]:
    """Put ``replay`` (the marker's and ring's wrapper) over ``graph_class.replay`` only while a
    profiler records or a ring keeps replays: on at the profiler's start notice or as the
    ring opens, off when neither is left (``agent.captures``' switches); for the whole process
    where there is no notice (``profiler_notices``)."""
    notices = profiler_notices()
    agent.state.add_listener(agent.captures.state_changed)  # (the rings that keep replays)
    if notices is None:
        return wrap_attribute(graph_class, "replay", replay, agent.proxies)
    original = graph_class.__dict__.get("replay") if graph_class is not None else None
    if original is None or agent.proxies.is_proxy(original):
        return []
    proxy = agent.proxies.get(original) or agent.proxies.put(
        original, wrapt.FunctionWrapper(original, replay))
    switched = SwitchedPatch(graph_class, "replay", original, proxy)
    captures = agent.captures
    captures.replay_switches = [*(s for s in captures.replay_switches
                                  if (s.owner, s.name) != (graph_class, "replay")), switched]

    def notice(on: bool) -> Any:
        def noticed(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            result = wrapped(*args, **kwargs)
            captures.profiling = on
            if agent.state.live:
                captures.switch_replays()
            return result

        return noticed

    patches: list[Patch] = [switched]
    patches += wrap_attribute(notices, "_run_on_profiler_start", notice(True), agent.proxies)
    patches += wrap_attribute(notices, "_run_on_profiler_stop", notice(False), agent.proxies)
    captures.profiling = bool(getattr(notices, "_is_profiler_enabled", False))  # one records
    if agent.state.live:
        captures.switch_replays()
    return patches


def _graph_init(agent: Any) -> Any:
    """``torch.cuda.graph(...)``'s wrapper: torch's own annotations on where they work."""

    def init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if ("enable_annotations" not in kwargs and agent.config.torch_annotations
                and features.tools_id_usable()):
            kwargs = {**kwargs, "enable_annotations": True}
        return wrapped(*args, **kwargs)

    return init


def install(graphs: ModuleType, agent: Any) -> list[Patch]:
    """Wrap ``graphs.CUDAGraph``'s capture methods (and its replay while a profiler records)
    and ``graphs.graph.__init__``, reporting to ``agent.captures``."""
    patches: list[Patch] = []
    graph_class = getattr(graphs, "CUDAGraph", None)
    hooks = capture_hooks(agent.captures)
    for name in ("capture_begin", "capture_end"):
        patches += wrap_attribute(graph_class, name, hooks[name], agent.proxies)
    patches += mark_replays_while_profiling(graph_class, hooks["replay"], agent)
    context_class = getattr(graphs, "graph", None)
    init = getattr(context_class, "__init__", None)
    if init is not None and "enable_annotations" in _parameters(init):
        patches += wrap_attribute(context_class, "__init__", _graph_init(agent), agent.proxies)
    return patches


def _parameters(function: Any) -> Any:
    try:
        return inspect.signature(function).parameters
    except (TypeError, ValueError):
        return {}

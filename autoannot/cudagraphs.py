"""CUDA graphs: know when a capture is in progress, keep a ledger of the collectives each graph
captured, and mark each replay in the profiler trace — with no CUDA call on the hot path and
no toolsId support needed.

* ``CUDAGraph.capture_begin`` / ``capture_end`` are wrapped to count captures (the collective
  wrappers only read the count), to name each graph ``autoannot.graph.<n>`` and to start and
  stop the launch observers for it.
* While a graph is being captured, every launch into that capture is noted in that graph's
  ledger, in launch order (``Captures.note``; the native observer's notes join when the capture
  ends). A launch is tied to its capture by the capture itself, not by the thread that made it
  (``capture_identity``).
* ``CUDAGraph.replay`` is wrapped while a profiler records (``ReplayMarking``: put on and taken
  off at the profiler's start and stop, so a replay with no profiler runs torch's own method):
  each replay of a graph with a ledger runs inside ``record_function("autoannot.replay:<graph>")``,
  so the trace tool can tell which graph each ``cudaGraphLaunch`` launched.
* Where torch's own path works (``mark_kernels`` + ``cudaGraphNodeGetToolsId``), every
  ``torch.cuda.graph`` capture gets ``enable_annotations=True`` unless the user said otherwise or
  ``AUTOANNOT_TORCH_ANNOTATIONS=0``.
"""

from __future__ import annotations

import _thread
import inspect
import itertools
from types import ModuleType
from typing import Any

import wrapt

from autoannot import diagnostics, features
from autoannot.capture_identity import ByThread, CaptureIdentity, Capturing
from autoannot.ledgers import Ledger, Ledgers
from autoannot.patching import Patch
from autoannot.sites import call_site
from autoannot.traces.names import GRAPH_PREFIX, REPLAY_PREFIX


def _said(step: str, exc: Exception) -> None:
    diagnostics.warn_once(f"CUDAGraph.{step}", "the agent's part", exc)


class Captures:
    """The agent's part in CUDA-graph captures: the ledgers, which capture a launch goes into,
    and what beginning and ending a capture does. ``agent``: the ``Instrumentation`` (its
    ``state``, ``config`` and launch observers)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.ledgers = Ledgers()
        self.capturing = Capturing()
        self.identity = CaptureIdentity(self.ledgers, self.capturing)
        self._numbers = itertools.count()
        #: The replay wrappers switched on and off by the profiler's notices (copy-on-write).
        self.replay_switches: list[Any] = []
        #: torch's ``mark_kernels`` where it records in the captures in progress, else None:
        #: asked when a capture begins (torch turns its annotations on before), not per launch.
        self.torch_marks: Any = None

    def by_thread(self) -> None:
        """Tie a launch to the capture begun on its own thread (tests with no CUDA: a CUDA
        build with no driver finds no capture at all)."""
        self.identity = CaptureIdentity(self.ledgers, self.capturing,
                                        ByThread(self.capturing))

    def note(self, api: str, annotation: dict[str, Any], kernels: tuple[str, ...],
             site: str | None) -> None:
        """A collective launched while a capture is in progress: into its graph's ledger."""
        ledger = self.identity.current()
        if ledger is None:
            return  # this launch goes into no capture (eager work on another stream)
        if site is None:  # from our caller's caller: the user's line, mostly
            site = call_site(3)
        observer = self.agent.observer  # (after the observer's notes so far: see _join_notes)
        ledger.launched.append((api, annotation, kernels, site,
                                0 if observer is None else observer.order[0] + 0.5))

    def ledger_of(self, graph: Any) -> Ledger | None:
        name = getattr(graph, "_autoannot_graph", None)
        return self.ledgers.get(name) if name is not None else None

    def began(self, graph: Any) -> None:
        previous = getattr(graph, "_autoannot_graph", None)
        if previous is not None:  # captured again (after reset()): its old ledger is retired
            self.ledgers.retire(previous)
        ledger = Ledger(f"{GRAPH_PREFIX}{next(self._numbers)}")
        try:  # noqa: SIM105 (contextlib.suppress: 3 more calls, and a capture pays for each)
            graph._autoannot_graph = ledger.name
        except AttributeError:  # a graph class without attributes
            pass
        self.ledgers.add(ledger, graph)
        self.capturing.stack.append(ledger)
        try:
            self.identity.began(ledger)
        except Exception as exc:  # the capture goes on; its ledger stays empty
            diagnostics.warn_once("CUDAGraph.capture_begin", "identifying the capture", exc)
        agent = self.agent
        if agent.observer is not None:  # launches no proxy sees, noted by this capture's id
            ledger.native_capture = agent.observer.capture_began()
        else:
            layer = agent.python_layer()
            if layer is not None:  # C++-origin launches on this thread (and autograd's)
                layer.hold()
                ledger.holder = (_thread.get_ident(), layer)
        try:
            self.torch_marks = features.mark_kernels(agent.config.mark_kernels)
        except Exception as exc:  # torch's probe failed: the ledger annotates this capture
            diagnostics.warn_once("CUDAGraph.capture_begin", "asking torch's annotations", exc)
            self.torch_marks = None
        agent.state.capture_started()

    def ended(self, graph: Any) -> None:
        stack = self.capturing.stack
        ledger = self.ledger_of(graph)
        if ledger is not None and ledger in stack:
            stack.remove(ledger)
        elif stack:
            ledger = stack.pop()
        agent = self.agent
        try:
            if ledger is not None:
                ledger.capturing = False
                try:
                    self.identity.ended(ledger)
                    if ledger.native_capture is not None and agent.observer is not None:
                        self._join_notes(ledger)
                finally:  # (whatever failed above: the layer is not left held)
                    holder, ledger.holder = ledger.holder, None
                    if holder is not None and holder[0] == _thread.get_ident():
                        holder[1].release()
        finally:
            agent.state.capture_ended()

    def _join_notes(self, ledger: Ledger) -> None:
        """The launches the native observer noted in this capture join the ledger, in launch
        order."""
        observer = self.agent.observer
        try:
            noted = observer.capture_ended(ledger.native_capture,
                                           last=self.agent.state.captures <= 1)
        except Exception as exc:  # the capture stands; these launches go unannotated
            _said("capture_end (the native observer's notes)", exc)
            return
        if noted and ledger.launched:  # both kinds of note: into launch order
            ledger.launched[:] = sorted(ledger.launched + noted, key=lambda launch: launch[4])
        elif noted:  # (drained in launch order)
            ledger.launched += noted

    def verify(self, graph: Any) -> None:
        """``AUTOANNOT_VERIFY=1``: compare the graph's collectives with the other ranks' now;
        a difference raises ``SequenceMismatch`` (on purpose: the replay would hang)."""
        agent = self.agent
        if not agent.config.verify or not agent.state.live:
            return
        from autoannot.traces.analysis import sequences

        ledger = self.ledger_of(graph)
        if ledger is None:
            return
        try:
            sequences.verify_capture(ledger.name, ledger.entries)
        except sequences.SequenceMismatch:
            raise
        except Exception as exc:  # the comparison itself failed: the capture stands
            _said("capture_end (AUTOANNOT_VERIFY)", exc)

    def replay_marker(self, graph: Any) -> Any:
        """``record_function("autoannot.replay:<graph>")`` while a profiler records; else
        None."""
        name = getattr(graph, "_autoannot_graph", None)
        if name is None or not self.agent.state.live or not _profiler_running():
            return None
        import torch

        return torch.profiler.record_function(REPLAY_PREFIX + name)


def _profiler_running() -> bool:
    """Whether a profiler records on this thread or for the whole process: one started by a
    Python profiler object, or on demand (Kineto's daemon, dynolog), which sets no Python
    flag."""
    import torch

    if torch.autograd.profiler._is_profiler_enabled:
        return True
    kind = getattr(torch._C._autograd, "_profiler_type", None)
    return kind is not None and getattr(kind(), "name", "NONE") != "NONE"


def capture_hooks(captures: Captures) -> dict[str, Any]:
    """wrapt wrappers of ``CUDAGraph``'s methods, reporting to ``captures`` (what ``install``
    puts on the class; the stand-in capture and the tests call them on stand-in graphs)."""

    def capture_begin(wrapped: Any, graph: Any, args: tuple, kwargs: dict) -> Any:
        result = wrapped(*args, **kwargs)
        try:
            captures.began(graph)
        except Exception as exc:  # the capture goes on; its collectives may go unannotated
            _said("capture_begin", exc)
        return result

    def capture_end(wrapped: Any, graph: Any, args: tuple, kwargs: dict) -> Any:
        try:
            result = wrapped(*args, **kwargs)
        finally:
            try:
                captures.ended(graph)
            except Exception as exc:
                _said("capture_end", exc)
        captures.verify(graph)
        return result

    def replay(wrapped: Any, graph: Any, args: tuple, kwargs: dict) -> Any:
        try:
            marker = captures.replay_marker(graph)
        except Exception as exc:  # the replay runs, unmarked
            _said("replay", exc)
            marker = None
        if marker is None:
            return wrapped(*args, **kwargs)
        with marker:
            return wrapped(*args, **kwargs)

    return {"capture_begin": capture_begin, "capture_end": capture_end, "replay": replay}


class SwitchedPatch(Patch):
    """A patch put on and taken off while the agent is on (``switch``); undone by identity."""

    __slots__ = ()

    def switch(self, on: bool) -> None:
        current = self.current()
        if on and current is self.original:
            setattr(self.owner, self.name, self.replacement)
        elif not on and current is self.replacement:
            setattr(self.owner, self.name, self.original)

    def undo(self) -> bool:
        restored = self.current() is self.replacement
        self.switch(False)
        return restored


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
    """Put ``replay`` (the marker's wrapper) over ``graph_class.replay`` only while a profiler
    records: on at the profiler's start notice, off at its stop (``agent.captures``' switches);
    for the whole process where there is no notice (``profiler_notices``)."""
    notices = profiler_notices()
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
            if agent.state.live:
                for switch in captures.replay_switches:
                    switch.switch(on)
            return result

        return noticed

    patches: list[Patch] = [switched]
    patches += wrap_attribute(notices, "_run_on_profiler_start", notice(True), agent.proxies)
    patches += wrap_attribute(notices, "_run_on_profiler_stop", notice(False), agent.proxies)
    if getattr(notices, "_is_profiler_enabled", False):  # one records now
        switched.switch(True)
    return patches


def _graph_init(agent: Any) -> Any:
    """``torch.cuda.graph(...)``'s wrapper: torch's own annotations on where they work."""

    def init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if ("enable_annotations" not in kwargs and agent.config.torch_annotations
                and features.tools_id_usable()):
            kwargs = {**kwargs, "enable_annotations": True}
        return wrapped(*args, **kwargs)

    return init


def wrap_attribute(owner: Any, name: str, wrapper: Any, proxies: Any) -> list[Patch]:
    """Put a proxy (the one cached for the original in ``proxies``) over ``owner.name``."""
    original = owner.__dict__.get(name) if owner is not None else None
    if original is None or proxies.is_proxy(original):
        return []  # absent, or already ours
    proxy = proxies.get(original) or proxies.put(original,
                                                 wrapt.FunctionWrapper(original, wrapper))
    setattr(owner, name, proxy)
    return [Patch(owner, name, original, proxy)]


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

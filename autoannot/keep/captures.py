"""The agent's part in CUDA-graph captures: a ledger per captured graph, which capture a launch
goes into, what beginning and ending a capture does, and the marker of each replay.

* While a graph is being captured, every launch into that capture is noted in that graph's
  ledger, in launch order (``Captures.note``; the native observer's notes join when the capture
  ends). A launch is tied to its capture by the capture itself, not by the thread that made it
  (``capture_identity``).
* Each replay of a graph with a ledger, while a profiler records, runs inside
  ``record_function("autoannot.replay:<graph>")`` (``replay_marker``), so the trace tools can
  tell which graph each ``cudaGraphLaunch`` launched.
* Each replay of a graph with a ledger, while a ring that keeps replays is open, writes a
  record for each of its launches to it (``replay_kept``, ``replayed``).

``agent.graph_patches`` puts these on torch's ``CUDAGraph``.
"""

from __future__ import annotations

import _thread
import itertools
import operator
from typing import Any

from autoannot.base import diagnostics, features
from autoannot.describe.sites import call_site
from autoannot.keep import gpu_clock
from autoannot.keep.capture_identity import ByThread, CaptureIdentity, Capturing
from autoannot.keep.ledgers import Ledger, Ledgers, Noted
from autoannot.traces.names import GRAPH_PREFIX, REPLAY_PREFIX


def said(step: str, exc: Exception) -> None:
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
        #: The replay wrappers switched on and off by the profiler's notices and the rings
        #: that keep replays (copy-on-write).
        self.replay_switches: list[Any] = []
        #: Whether a profiler records (as its notices said).
        self.profiling = False
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
        observer = self.agent.observer  # (after the observer's notes so far: see Noted.order)
        ledger.launched.append(_new_note(Noted, (
            api, annotation, kernels, site, 0 if observer is None else observer.order[0] + 0.5)))

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
        gpu_clock.capture_over()
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
                for journal in agent.state.journals:  # (the GPU's events of its launches)
                    if (clock := getattr(journal, "gpu", None)) is not None:
                        clock.capture_ended(ledger.name)
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
            said("capture_end (the native observer's notes)", exc)
            return
        if noted and ledger.launched:  # both kinds of note: into launch order
            ledger.launched[:] = sorted(ledger.launched + noted, key=_order)
        elif noted:  # (drained in launch order)
            ledger.launched += noted

    def state_changed(self, state: Any) -> None:
        """(A listener of the agent's state) the replay wrappers on while a ring that keeps
        replays is open (``route.replay_keepers``) or a profiler records."""
        if state.live:
            self.switch_replays()
        else:  # (disabled: the patches are undone next; an enable makes new switches)
            switches, self.replay_switches = self.replay_switches, []
            for switch in switches:
                switch.switch(False)

    def switch_replays(self) -> None:
        """Each replay wrapper on while a profiler records or a ring keeps replays."""
        on = self.profiling or bool(self.agent.state.route.replay_keepers)
        for switch in self.replay_switches:
            switch.switch(on)

    def replay_kept(self, graph: Any) -> tuple[str, list[dict[str, Any]]] | None:
        """What a replay of ``graph`` writes to the rings that keep replays (the route's):
        its ledger's name and entries; None if no ring keeps replays, or the graph was
        captured with no ledger or no launch."""
        ledger = self.ledger_of(graph)
        if (not self.agent.state.route.replay_keepers or ledger is None or ledger.capturing
                or not ledger.entries):
            return None
        return ledger.name, ledger.entries

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


#: ``Noted(...)`` without NamedTuple's argument parsing (a launch in a capture pays for it).
_new_note = tuple.__new__
#: A note's launch order (a ``Noted``, or a plain tuple of its shape from the native observer).
_order = operator.itemgetter(Noted._fields.index("order"))

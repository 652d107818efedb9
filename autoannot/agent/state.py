"""The switches the wrappers read on every call, and the per-thread call state.

The hot path reads one attribute, ``state.demand``: true only while the agent is enabled and a
recorder or journal is open or a CUDA-graph capture is in progress. Then a launch takes
``state.route`` (``keep.route.Route``), made anew at every change: what a launch must do now.
One ``State`` belongs to the agent's ``Instrumentation``, which hands it to the parts that read
it; every change goes through its methods, which remake the route and tell its listeners (the
launch observers) under its lock.
"""

from __future__ import annotations

import _thread
import os

from autoannot.base import locks
from autoannot.keep.route import Route

TYPE_CHECKING = False  # typing is not imported at start-up: it costs milliseconds
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class CallState(_thread._local):
    """Per thread: the open coalescing blocks and a batch's label."""

    def __init__(self) -> None:
        self.blocks: list[Any] = []
        self.batch_label: str | None = None


def _forget_other_threads(inside: dict[int, int]) -> None:
    """In a forked child, only the forking thread lives: the others' depths go (a new thread
    may be given one of their idents)."""
    ident = _thread.get_ident()
    for other in [i for i in inside if i != ident]:
        inside.pop(other, None)


class State:
    __slots__ = ("__weakref__", "_listeners", "_lock", "blocks", "calls", "captures", "demand",
                 "exclusion", "graphs", "inside", "journals", "live", "recorders", "route")

    def __init__(self) -> None:
        self._lock = locks.renewed(self, "_lock")
        self.recorders: tuple[list[Any], ...] = ()  # copy-on-write: read without the lock
        #: Written to as each launch is entered, before it runs (``AUTOANNOT_RECORD``'s file):
        #: objects with ``enter(record)``; copy-on-write too.
        self.journals: tuple[Any, ...] = ()
        self.captures = 0  # CUDA-graph captures in progress, in this process
        self.live = False  # the agent is enabled: proxies annotate
        self.demand = False  # live, and a recorder or journal is open or a capture in progress
        self.blocks = 0  # _coalescing_manager blocks open, on any thread
        #: How a wrapper runs the call it annotates (``observe.wrappers.Exclusion``); None:
        #: plainly.
        self.exclusion: Any = None
        self.calls = CallState()
        #: The threads inside a wrapped call now: thread ident -> how deep (absent: not inside).
        #: A dict, not a thread-local attribute: read and written on every annotated launch,
        #: at about half the instructions of a ``_thread._local`` attribute. A thread writes
        #: only its own entry, which goes when its outermost wrapped call returns.
        self.inside: dict[int, int] = {}
        if hasattr(os, "register_at_fork"):
            inside = self.inside
            os.register_at_fork(after_in_child=lambda: _forget_other_threads(inside))
        #: The agent's ``keep.captures.Captures`` once made (the ledgers, torch's marks).
        self.graphs: Any = None
        #: What a launch must do now (``keep.route.Route``), made anew at every change.
        self.route = Route(self)
        #: Told of every change, under the lock: ``listener(state)``.
        self._listeners: tuple[Callable[[State], None], ...] = ()

    def _refresh(self) -> None:
        """Recompute demand (under the lock) and tell the listeners."""
        self.demand = self.live and (bool(self.recorders) or bool(self.journals)
                                     or self.captures > 0)
        self.route = Route(self, self.graphs)
        for listener in self._listeners:
            listener(self)

    def add_listener(self, listener: Callable[[State], None]) -> None:
        with self._lock:
            if listener not in self._listeners:
                self._listeners = (*self._listeners, listener)
            listener(self)

    def remove_listener(self, listener: Callable[[State], None]) -> None:
        with self._lock:
            self._listeners = tuple(x for x in self._listeners if x is not listener)

    def set_exclusion(self, exclusion: Any) -> None:
        self.exclusion = exclusion

    def set_graphs(self, graphs: Any) -> None:
        """The agent's captures (``keep.captures.Captures``), once made."""
        with self._lock:
            self.graphs = graphs
            self._refresh()

    def set_live(self, live: bool) -> None:
        with self._lock:
            self.live = live
            self._refresh()

    def open_recorder(self, recorder: list[Any]) -> None:
        with self._lock:
            self.recorders = (*self.recorders, recorder)
            self._refresh()

    def close_recorder(self, recorder: list[Any]) -> None:
        with self._lock:
            self.recorders = tuple(r for r in self.recorders if r is not recorder)
            self._refresh()

    def rerouted(self) -> None:
        """What a launch must do changed within an open journal (a ring's GPU source
        decided): the route made anew."""
        with self._lock:
            self._refresh()

    def open_journal(self, journal: Any) -> None:
        with self._lock:
            self.journals = (*self.journals, journal)
            self._refresh()

    def close_journal(self, journal: Any) -> None:
        with self._lock:
            self.journals = tuple(j for j in self.journals if j is not journal)
            self._refresh()

    def block_opened(self, opened: bool) -> None:
        with self._lock:
            self.blocks = max(0, self.blocks + (1 if opened else -1))
            self._refresh()

    def capture_started(self) -> None:
        with self._lock:
            self.captures += 1
            self._refresh()

    def capture_ended(self) -> None:
        with self._lock:
            self.captures = max(0, self.captures - 1)
            self._refresh()

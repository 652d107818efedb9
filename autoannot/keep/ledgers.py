"""Capture ledgers: what each captured CUDA graph launches, in capture order, kept as long as
its graph lives (and for the last graphs retired)."""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

from autoannot.base import locks


class _Lock:
    def __init__(self) -> None:
        # reentrant: a graph freed while it is held (a collection) retires its ledger
        self.lock = locks.renewed(self, "lock", reentrant=True)


_LOCK = _Lock()  # (renewed in a forked child)


class Noted(NamedTuple):
    """A launch as its capture notes it (a launch pays for a tuple, not a dict; it becomes an
    entry when the ledger is read). The native observer drains its notes in this shape, as
    plain tuples."""

    label: str
    annotation: dict[str, Any]
    kernels: tuple[str, ...]
    call_site: str
    #: Launch order among the native observer's notes, which it numbers 1, 2, ...: a launch
    #: noted in Python after n of them has n + 0.5 (0 without the native observer); by it the
    #: native observer's notes join the others when the capture ends.
    order: float


class Ledger:
    """What one captured graph launches, in capture order: ``entries``, each ``{"api",
    "annotation", "kernels", "call_site"}``."""

    __slots__ = ("__weakref__", "_entries", "capture_id", "capturing", "holder", "launched",
                 "name", "native_capture")

    def __init__(self, name: str) -> None:
        self.name = name
        self.capturing = True  # until its capture ends
        #: What the launches note while the graph is captured, made entries when read.
        self.launched: list[Noted] = []
        self._entries: list[dict[str, Any]] = []
        self.capture_id: Any = None  # CUDA's id of the capture, where it is asked for
        self.native_capture: int | None = None  # the capture's id, as the native observer asks
        self.holder: Any = None  # (thread, dispatcher layer) holding the layer for it

    @property
    def entries(self) -> list[dict[str, Any]]:
        """The graph's collectives, in capture order (the same list each time: appending to
        it adds an entry)."""
        launched = self.launched
        if launched:
            with _LOCK.lock:
                count = len(launched)
                self._entries += [{"api": label, "annotation": annotation,
                                   "kernels": list(kernels), "call_site": site}
                                  for label, annotation, kernels, site, _ in launched[:count]]
                del launched[:count]
        return self._entries


class Ledgers:
    """The ledgers of the graphs alive, by name, and of the last ``KEEP_RETIRED`` graphs
    freed or captured again (a trace exported just after may still replay them): as many as
    the process has graphs, however many it captures over its life."""

    KEEP_RETIRED = 64

    def __init__(self) -> None:
        self.live: dict[str, Ledger] = {}
        self.retired: dict[str, Ledger] = {}
        #: A weak reference to each live graph, by its ledger's name: its callback retires the
        #: ledger when the graph is freed (a plain reference: ``weakref.finalize`` costs a
        #: capture several times as much).
        self._graphs: dict[str, Any] = {}

    def add(self, ledger: Ledger, graph: Any) -> None:
        name = ledger.name
        with _LOCK.lock:
            self.live[name] = ledger
        try:
            self._graphs[name] = weakref.ref(graph, lambda _, name=name: self.retire(name))
        except TypeError:  # a graph class without weak references: retired at its next capture
            return

    def retire(self, name: str) -> None:
        with _LOCK.lock:
            self._graphs.pop(name, None)
            ledger = self.live.pop(name, None)
            if ledger is None:
                return
            self.retired[name] = ledger
            while len(self.retired) > self.KEEP_RETIRED:
                del self.retired[next(iter(self.retired))]

    def get(self, name: str, default: Any = None) -> Any:
        ledger = self.live.get(name) or self.retired.get(name)
        return default if ledger is None else ledger

    def all(self) -> dict[str, Ledger]:
        """Every ledger kept, in capture order."""
        with _LOCK.lock:
            merged = {**self.retired, **self.live}
        return dict(sorted(merged.items(), key=lambda item: _graph_number(item[0])))

    def __len__(self) -> int:
        return len(self.live) + len(self.retired)

    def __iter__(self) -> Any:
        return iter(self.all())

    def __contains__(self, name: object) -> bool:
        return name in self.live or name in self.retired

    def __getitem__(self, name: str) -> Ledger:
        ledger = self.get(name)
        if ledger is None:
            raise KeyError(name)
        return ledger

    def __setitem__(self, name: str, ledger: Ledger) -> None:
        with _LOCK.lock:
            self.live[name] = ledger

    def __delitem__(self, name: str) -> None:
        with _LOCK.lock:
            if self.live.pop(name, None) is None:
                del self.retired[name]


def _graph_number(name: str) -> int:
    tail = name.rpartition(".")[2]
    return int(tail) if tail.isdigit() else -1

"""Process-wide switches the wrapper reads on every call, and the per-thread call state.

The hot path reads one attribute, ``STATE.demand``: true only while the agent is enabled and a
recorder or journal is open or a CUDA-graph capture is in progress. The rest is read only when
it is true.
"""

from __future__ import annotations

import _thread

from autoannot import locks

TYPE_CHECKING = False  # typing is not imported at start-up: it costs milliseconds
if TYPE_CHECKING:
    from typing import Any


class _State:
    __slots__ = ("__weakref__", "_lock", "before_launch", "blocks", "captures", "demand",
                 "exclusion", "journals", "live", "native", "recorders")

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
        #: A block, capture or journal open: the wrappers have work before the call.
        self.before_launch = False
        #: ``(set_excluded, key)`` while some thread holds the dispatcher layer (its kernels
        #: registered): the wrappers exclude the key around the call they annotate. None while
        #: no thread holds it: then no thread includes the key, and nothing is toggled.
        self.exclusion: tuple[Any, Any, Any] | None = None
        #: The native kernel's module while some thread holds the dispatcher layer and the
        #: kernel is on (``autoannot.native``); armed while captures are the only demand.
        self.native: Any = None

    def _refresh(self) -> None:
        """Recompute demand (under the lock)."""
        self.demand = self.live and (bool(self.recorders) or bool(self.journals)
                                     or self.captures > 0)
        self.before_launch = self.blocks > 0 or self.captures > 0 or bool(self.journals)
        if self.native is not None:  # a recorder or journal wants each launch as it is made
            armed = self.live and self.captures > 0 and not self.recorders and not self.journals
            self.native.set_armed(armed)
            # The proxies hand their launches to it too, but in a coalescing block (one launch
            # for its calls) or where torch's own mark_kernels records them.
            self.native.set_handoff(armed and not self.blocks and _no_mark_kernels())

    def set_native(self, native: Any) -> None:
        with self._lock:
            if self.native is not None and native is None:
                self.native.set_armed(False)
                self.native.set_handoff(False)
            self.native = native
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


def _no_mark_kernels() -> bool:
    from autoannot import features

    return features.mark_kernels() is None


STATE = _State()


class _CallState(_thread._local):
    """Per thread: how deep inside wrapped calls we are, and the open coalescing blocks."""

    def __init__(self) -> None:
        self.depth = 0
        self.blocks: list[Any] = []
        self.batch_label: str | None = None


CALLS = _CallState()

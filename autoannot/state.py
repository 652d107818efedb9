"""Process-wide switches the wrapper reads on every call, and the per-thread call state.

The hot path reads one attribute, ``STATE.demand``: true only while the agent is enabled and a
recorder is open or a CUDA-graph capture is in progress. The rest is read only when it is true.
"""

from __future__ import annotations

import _thread
import os

TYPE_CHECKING = False  # typing is not imported at start-up: it costs milliseconds
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class _State:
    __slots__ = ("_listeners", "_lock", "captures", "demand", "live", "recorders")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self.recorders: tuple[list[Any], ...] = ()  # copy-on-write: read without the lock
        self.captures = 0  # CUDA-graph captures in progress, in this process
        self.live = False  # the agent is enabled: proxies annotate
        self.demand = False  # live, and a recorder is open or a capture in progress
        # Called as listener(demand, cause) when demand changes; cause: "live", "recorder"
        # or "capture" (what changed it).
        self._listeners: tuple[Callable[[bool, str], None], ...] = ()

    def add_demand_listener(self, listener: Callable[[bool, str], None]) -> None:
        with self._lock:
            if listener not in self._listeners:
                self._listeners = (*self._listeners, listener)

    def _refresh(self) -> bool:
        """Recompute demand (under the lock); True if it changed."""
        demand = self.live and (bool(self.recorders) or self.captures > 0)
        changed, self.demand = demand != self.demand, demand
        return changed

    def _changed(self, cause: str) -> None:
        """(Outside the lock.) Tell the listeners; they re-read ``demand`` themselves."""
        for listener in self._listeners:
            listener(self.demand, cause)

    def set_live(self, live: bool) -> None:
        with self._lock:
            self.live = live
            changed = self._refresh()
        if changed:
            self._changed("live")

    def open_recorder(self, recorder: list[Any]) -> None:
        with self._lock:
            self.recorders = (*self.recorders, recorder)
            changed = self._refresh()
        if changed:
            self._changed("recorder")

    def close_recorder(self, recorder: list[Any]) -> None:
        with self._lock:
            self.recorders = tuple(r for r in self.recorders if r is not recorder)
            changed = self._refresh()
        if changed:
            self._changed("recorder")

    def capture_started(self) -> None:
        with self._lock:
            self.captures += 1
            changed = self._refresh()
        if changed:
            self._changed("capture")

    def capture_ended(self) -> None:
        with self._lock:
            self.captures = max(0, self.captures - 1)
            changed = self._refresh()
        if changed:
            self._changed("capture")

    def after_fork_in_child(self) -> None:
        self._lock = _thread.allocate_lock()


STATE = _State()


class _CallState(_thread._local):
    """Per thread: how deep inside wrapped calls we are, and the open coalescing blocks."""

    def __init__(self) -> None:
        self.depth = 0
        self.blocks: list[Any] = []
        self.batch_label: str | None = None


CALLS = _CallState()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=STATE.after_fork_in_child)

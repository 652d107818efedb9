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
    __slots__ = ("_lock", "captures", "demand", "first_demand", "live", "recorders")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self.recorders: tuple[list[Any], ...] = ()  # copy-on-write: read without the lock
        self.captures = 0  # CUDA-graph captures in progress, in this process
        self.live = False  # the agent is enabled: proxies annotate
        self.demand = False  # live, and a recorder is open or a capture in progress
        # Called once, when demand first turns true (dispatch.py registers its kernels then).
        self.first_demand: list[Callable[[], None]] = []

    def _refresh(self) -> list[Callable[[], None]]:
        self.demand = self.live and (bool(self.recorders) or self.captures > 0)
        if self.demand and self.first_demand:
            hooks, self.first_demand = self.first_demand, []
            return hooks
        return []

    def _update(self, change: Callable[[], None]) -> None:
        with self._lock:
            change()
            hooks = self._refresh()
        for hook in hooks:  # outside the lock: a hook may read the state
            hook()

    def set_live(self, live: bool) -> None:
        def change() -> None:
            self.live = live

        self._update(change)

    def open_recorder(self, recorder: list[Any]) -> None:
        def change() -> None:
            self.recorders = (*self.recorders, recorder)

        self._update(change)

    def close_recorder(self, recorder: list[Any]) -> None:
        def change() -> None:
            self.recorders = tuple(r for r in self.recorders if r is not recorder)

        self._update(change)

    def capture_started(self) -> None:
        def change() -> None:
            self.captures += 1

        self._update(change)

    def capture_ended(self) -> None:
        def change() -> None:
            self.captures = max(0, self.captures - 1)

        self._update(change)

    def cancel_first_demand(self, hook: Callable[[], None]) -> None:
        with self._lock:
            self.first_demand = [h for h in self.first_demand if h != hook]

    def on_first_demand(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when demand first turns true (now, if it is)."""
        with self._lock:
            if not self.demand:
                if hook not in self.first_demand:
                    self.first_demand.append(hook)
                return
        hook()

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

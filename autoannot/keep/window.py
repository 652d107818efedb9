"""A profiler's window, held in memory: from the moment a profiler starts recording
(``start_trace``) until it stops (``stop_trace``), the agent keeps each launch in a ring of no
files (``keep.ring.Ring(None)``). The rows written at its export (``live.export``) are named
and timed by it where no record file and no ``AUTOANNOT_RING`` is open: gloo's collectives get
their groups, sizes and call sites with ``AUTOANNOT=1`` alone, and two async launches gloo ran
out of order keep their own timings by their Works' completion, shapes recorded or not.

Nothing is held while no profiler records: the wrappers' idle path is unchanged.
"""

from __future__ import annotations

import weakref
from typing import Any

#: The launches a window holds at most (40 bytes each: 2.6 MB): a profiler window is a few
#: steps; a longer one keeps its last launches.
WINDOW_LAUNCHES = 1 << 16


class Windows:
    """The windows of the profilers now recording (or stopped and not yet exported), by
    profiler."""

    def __init__(self, agent: Any) -> None:
        self._agent = agent
        self._rings: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def started(self, profiler: Any) -> None:
        """``profiler`` starts recording: a fresh window (the last one's launches let go)."""
        from autoannot.keep.ring import Ring

        self.stopped(profiler)
        ring = Ring(None, WINDOW_LAUNCHES)
        self._rings[profiler] = ring
        self._agent.state.open_journal(ring)

    def stopped(self, profiler: Any) -> None:
        """``profiler`` stopped recording: its window takes no more launches (it is kept for
        the export)."""
        ring = self._rings.get(profiler)
        if ring is not None:
            self._agent.state.close_journal(ring)

    def held(self, profiler: Any) -> tuple[bytes, list[dict[str, Any]]] | None:
        """The launches of ``profiler``'s last window: its ring's bytes and names, as a
        reader reads a ring's files (``ring_files.read_held``); None where it held none."""
        ring = self._rings.get(profiler)
        return None if ring is None else ring.held()

    def close_all(self) -> None:
        """(The agent turned off) every window let go."""
        for profiler in list(self._rings):
            self.stopped(profiler)
        self._rings.clear()


def start_wrapper(agent: Any) -> Any:
    """The wrapper of ``_KinetoProfile.start_trace``: a window opened as the profiler starts
    (where rows are written at export); a failure of ours is said once, the profiler starts."""

    def start_trace(wrapped: Any, profiler: Any, args: tuple, kwargs: dict) -> Any:
        if agent.state.live and agent.config.rows_on_export:
            try:
                agent.windows.started(profiler)
            except Exception as exc:
                from autoannot.base import diagnostics

                diagnostics.warn_once("start_trace", "holding the profiler's window", exc)
        return wrapped(*args, **kwargs)

    return start_trace


def stop_wrapper(agent: Any) -> Any:
    """The wrapper of ``_KinetoProfile.stop_trace``: the window takes no more launches."""

    def stop_trace(wrapped: Any, profiler: Any, args: tuple, kwargs: dict) -> Any:
        try:
            return wrapped(*args, **kwargs)
        finally:
            try:
                agent.windows.stopped(profiler)
            except Exception as exc:
                from autoannot.base import diagnostics

                diagnostics.warn_once("stop_trace", "closing the profiler's window", exc)

    return stop_trace

"""``AUTOANNOT_WATCH=1``: rank 0 of the job watches the rings of ``AUTOANNOT_RING``'s folder in
a thread of its own and says a hang in the job's log (stderr) while it hangs
(``traces/watch.py``). The thread is a daemon: it never keeps the job from ending, and a
failure of its own ends it, said once; the job goes on as it was."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def start_on_rank_0(ring: Any) -> None:
    """Start the watcher once ``ring`` is opened, where it is rank 0's. Settings that cannot be
    read are said on stderr; nothing is watched then."""
    from autoannot.base import config

    try:
        interval, stall = config.watch_interval(), config.watch_stall()
    except ValueError as exc:
        sys.stderr.write(f"autoannot: {exc}: AUTOANNOT_WATCH is off\n")
        return

    def opened(one: Any) -> None:
        if one.rank != 0:
            return
        import threading

        threading.Thread(target=_watch, args=(one.folder, interval, stall), daemon=True,
                         name="autoannot-watch").start()

    ring.on_open.append(opened)


def _watch(folder: str, interval: float, stall: float) -> None:
    try:
        from pathlib import Path

        from autoannot.traces.watch import Watcher

        def say(line: str) -> None:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

        Watcher(Path(folder), stall, say).run(interval)
    except Exception as exc:  # never the job's: said once, the watch ends
        sys.stderr.write(f"autoannot: AUTOANNOT_WATCH stopped ({type(exc).__name__}: {exc}); "
                         "the job goes on unwatched\n")

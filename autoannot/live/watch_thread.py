"""``AUTOANNOT_WATCH=1``: rank 0 of the job watches the rings of ``AUTOANNOT_RING``'s folder in
a thread of its own and says a hang or a straggler in the job's log (stderr) while it lasts
(``live/watch.py``); with ``AUTOANNOT_WATCH_PROMETHEUS=PORT`` it serves the job's
metrics there (``live/metrics.py``). The thread is a daemon: it never keeps the job
from ending, and a failure of its own ends it, said once; the job goes on as it was."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def start_on_rank_0(ring: Any) -> None:
    """Start the watcher once ``ring`` is opened, where it is rank 0's: of the rings of its
    folder, or of the progress the ranks publish to ``AUTOANNOT_WATCH_STORE``'s store (every
    host's ranks). Settings that cannot be read are said on stderr; nothing is watched
    then."""
    from autoannot.base import config

    try:
        interval, stall = config.watch_interval(), config.watch_stall()
        port = config.watch_prometheus()
    except ValueError as exc:
        sys.stderr.write(f"autoannot: {exc}: AUTOANNOT_WATCH is off\n")
        return

    def opened(one: Any) -> None:
        if one.rank != 0:
            return
        import threading

        try:
            store = config.watch_store()  # (the job's own store is known once it launches)
        except ValueError as exc:
            sys.stderr.write(f"autoannot: {exc}: AUTOANNOT_WATCH is off\n")
            return
        threading.Thread(target=_watch, args=(one.folder, interval, stall, port, store),
                         daemon=True, name="autoannot-watch").start()

    ring.on_open.append(opened)


def _watch(folder: str, interval: float, stall: float, port: int | None,
           store: tuple[str, int] | None = None) -> None:
    try:
        from pathlib import Path

        from autoannot.live import watch

        def say(line: str) -> None:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

        metrics = None
        if port is not None:
            try:
                metrics = watch.served_metrics(port, say)
            except (ImportError, OSError) as exc:  # (watched all the same, without them)
                say(f"autoannot: AUTOANNOT_WATCH_PROMETHEUS={port}: no metrics served "
                    f"({type(exc).__name__}: {exc}; prometheus-client: pip install "
                    "'autoannot[watch]')")
        source = Path(folder) if store is None else watch.store_source(store)
        watch.Watcher(source, stall, say, metrics=metrics).run(interval)
    except Exception as exc:  # never the job's: said once, the watch ends
        sys.stderr.write(f"autoannot: AUTOANNOT_WATCH stopped ({type(exc).__name__}: {exc}); "
                         "the job goes on unwatched\n")

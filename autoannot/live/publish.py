"""``AUTOANNOT_WATCH_STORE``: every rank publishes its progress (``live.progress``: per
group its last launches and its straggler window, from its ring) to a c10d store — the job's
own, or another — every watch interval where it launched since, for a watcher on any host
(rank 0's, ``AUTOANNOT_WATCH=1``). One request a rank an interval at most (``multi_set`` of
two keys: ``autoannot/count/{rank}``, its launch count, which the watcher reads at every look,
and ``autoannot/progress/{rank}``, the document, read to say a hang, to look for stragglers and
for the metrics: with the rank's totals since its ring opened, per group, launches of each
collective and time in collectives, ``live.tally``).

It runs in a daemon thread of its own, through a store client of its own (torch's public
``TCPStore``, not the job's client object): a store that cannot be reached, or that stops
answering within its timeout, ends the publishing, said once; the job's launches never wait
on it. At the interpreter's exit it publishes once more (its totals complete), bounded by the
store's timeout.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time

from autoannot.base.ring_format import count_key, progress_key

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: The launches of each group a document carries for the straggler windows: enough for one
#: whole window however a read falls (two windows' worth).
TAIL = 40
#: How long a store request may take before the publishing ends (seconds).
TIMEOUT_S = 5.0


def connect(address: tuple[str, int], timeout_s: float = TIMEOUT_S) -> Any:
    """A client of the TCPStore at ``address`` (raises what torch raises where none answers)."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore(address[0], address[1], is_master=False,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


class Publisher:
    """Publishes ``ring``'s progress to ``store`` (``publish_once``: one look)."""

    def __init__(self, ring: Any, store: Any) -> None:
        from autoannot.live.tally import Tally

        self.ring = ring
        self.store = store
        self.tally = Tally()  # (its totals: the watcher's metrics)
        self._published = -1  # the launch count last published
        self._lock = threading.Lock()  # (the thread's looks, and the last one at exit)
        self.ended = False  # the store failed it: nothing more is published

    def publish_once(self, anyway: bool = False) -> bool:
        """Publish the ring's progress where it launched since the last (or ``anyway``: its
        last launches may have returned since); whether it did."""
        with self._lock:
            return self._publish_once(anyway)

    def _publish_once(self, anyway: bool) -> bool:
        from pathlib import Path

        from autoannot.live import progress
        from autoannot.traces.read import ring_files

        path = self.ring.ring_path
        if self.ended or path is None or (self.ring.count == self._published and not anyway):
            return False
        self.tally.update(Path(path))
        one = ring_files.read(Path(path), 1024)
        published = time.time_ns()
        document = progress.of_ring(one, TAIL, published_ns=published)
        document["totals"] = self.tally.totals()
        data = progress.encode(document)
        rank = int(one.rank if one.rank is not None else -1)
        count = f"{one.count} {published} {one.meta.get('run')}".encode()
        self.store.multi_set([count_key(rank), progress_key(rank)], [count, data])
        self._published = one.count
        return True


def start_from_environment(ring: Any) -> None:
    """Publish ``ring``'s progress to ``AUTOANNOT_WATCH_STORE``'s store every
    ``AUTOANNOT_WATCH_INTERVAL`` seconds, from its opening on (the job's own store is known
    then), in a daemon thread. Settings that cannot be read are said on stderr; nothing is
    published then."""

    def opened(one: Any) -> None:
        import threading

        from autoannot.base import config

        try:
            address, interval = config.watch_store(), config.watch_interval()
        except ValueError as exc:
            sys.stderr.write(f"autoannot: {exc}: no progress is published\n")
            return
        if address is not None:
            threading.Thread(target=_publish, args=(one, address, interval), daemon=True,
                             name="autoannot-publish").start()

    ring.on_open.append(opened)


def _publish(ring: Any, address: tuple[str, int], interval: float) -> None:
    publisher = None
    try:
        publisher = Publisher(ring, connect(address))
        atexit.register(_last, publisher)
        while True:
            publisher.publish_once()
            time.sleep(interval)
    except Exception as exc:  # never the job's: said once, the publishing ends
        if publisher is not None:
            publisher.ended = True
        sys.stderr.write(f"autoannot: AUTOANNOT_WATCH_STORE {address[0]}:{address[1]}: "
                         f"progress no longer published ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); the job goes on\n")


def _last(publisher: Publisher) -> None:
    """(At the interpreter's exit) the rank's last progress, its totals complete: at most the
    store's timeout where it no longer answers; a failure is not said (the job is done)."""
    try:
        publisher.publish_once(anyway=True)
    except Exception:
        publisher.ended = True

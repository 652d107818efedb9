"""A watched job's figures for the dashboards people already run: Prometheus metrics
(prometheus-client, ``pip install 'autoannot[watch]'``), updated at each of the watcher's
looks from the rings (``traces/render/watch.py``):

* ``autoannot_collectives_total{rank, group, collective}``: launches entered;
* ``autoannot_collective_seconds_total{rank, group}``: time from each launch's entry to its
  return, counted once it returned (a blocking call's completion: gloo's, and any
  ``async_op=False`` call on the CPU; for a Work or a GPU stream, its issue);
* ``autoannot_straggler_wait_seconds{rank, group}``: how long the others wait for a rank that
  stands out as a straggler (the median over the watcher's window; the series is there only
  while it stands out);
* ``autoannot_hang_culprit_rank``: the rank a hang waits on, -1 while none.

The counts are the watcher's own, from when it started: a launch that left a ring before a
look saw it (more than the ring's launches between two looks) is not counted, and said once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoannot.traces import files
from autoannot.traces.read import ring_files


class JobMetrics:
    """The metrics of one folder of rings, in a registry of their own."""

    def __init__(self, say: Any = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        self.launches = Counter("autoannot_collectives", "Collective launches entered",
                                ["rank", "group", "collective"], registry=self.registry)
        self.seconds = Counter("autoannot_collective_seconds", "Time from a collective's "
                               "entry to its return", ["rank", "group"], registry=self.registry)
        self.straggler = Gauge("autoannot_straggler_wait_seconds", "How long the others wait "
                               "for a rank that stands out as a straggler (median)",
                               ["rank", "group"], registry=self.registry)
        self.culprit = Gauge("autoannot_hang_culprit_rank", "The rank a hang waits on; -1: none",
                             registry=self.registry)
        self.culprit.set(-1)
        self.say = say
        self._next: dict[Path, int] = {}  # ring -> the first launch not yet counted
        self._open: dict[Path, dict[int, tuple[str, float]]] = {}  # launches not yet returned
        self._lost_said = False
        self._stragglers: set[tuple[str, str]] = set()

    def update(self, folder: Path) -> None:
        """Count what each ring entered, and what returned, since the last update."""
        for path in ring_files.in_folder(folder):
            try:
                self._update_one(path)
            except (files.TraceError, ValueError, KeyError):
                continue

    def _update_one(self, path: Path) -> None:
        start = self._next.get(path, 0)
        pending = self._open.setdefault(path, {})
        low = min([start, *pending])
        head = ring_files.read(path, 0)
        count, capacity = head.count, int(head.meta["capacity"])
        if count < start:  # (a new run wrote this file anew)
            start, low = 0, 0
            pending.clear()
        if count - low > capacity:
            if count - start > capacity and self.say and not self._lost_said:
                self._lost_said = True
                self.say(f"autoannot watch: {path.name} entered more than its "
                         f"{capacity:,} launches between two looks: metrics count from the "
                         "launches it still holds")
            low = max(low, count - capacity)
            start = max(start, low)
            pending = self._open[path] = {i: v for i, v in pending.items() if i >= low}
        one = ring_files.read(path, count - low)
        rank = str(one.rank)
        first = one.count - len(one.records)
        for k, record in enumerate(one.records):
            index = first + k
            kind = one.kinds.get(int(record["kind"]))
            if kind is None:
                continue
            group = str(kind["group"])
            if index >= start:
                collective = (kind.get("annotation") or {}).get("Collective name", kind["api"])
                self.launches.labels(rank, group, str(collective)).inc()
            if index >= start or index in pending:
                ended = int(record["returned_ns"])
                if ended > 0:
                    self.seconds.labels(rank, group).inc(
                        max(0, ended - int(record["entered_ns"])) / 1e9)
                    pending.pop(index, None)
                elif ended == 0:
                    pending[index] = (group, float(record["entered_ns"]))
                else:  # (raised)
                    pending.pop(index, None)
        self._next[path] = one.count

    def hang(self, culprit: int | None) -> None:
        self.culprit.set(-1 if culprit is None else culprit)

    def stragglers(self, found: dict[tuple[int, str], Any]) -> None:
        """Set the straggler gauge of each rank that stands out; remove the others'."""
        now = set()
        for (rank, group), straggler in found.items():
            now.add((str(rank), group))
            self.straggler.labels(str(rank), group).set(straggler.late_by_us / 1e6)
        for gone in self._stragglers - now:
            self.straggler.remove(*gone)
        self._stragglers = now

    def serve(self, port: int, address: str = "0.0.0.0") -> Any:
        """Serve the metrics over HTTP on ``port`` of ``address`` (every interface by default,
        as prometheus-client does: a scraper on another host reads it), in a daemon thread;
        the server."""
        from prometheus_client import start_http_server

        return start_http_server(port, addr=address, registry=self.registry)


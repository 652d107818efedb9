"""A watched job's figures for the dashboards people already run: Prometheus metrics
(prometheus-client, ``pip install 'autoannot[watch]'``), updated at each of the watcher's
looks from the rings (``live/watch.py``):

* ``autoannot_collectives_total{rank, group, group_desc, collective}``: launches entered;
* ``autoannot_collective_seconds_total{rank, group, group_desc}``: time from each launch's
  entry to its return, counted once it returned (a blocking call's completion: gloo's, and any
  ``async_op=False`` call on the CPU; for a Work or a GPU stream, its issue);
* ``autoannot_collective_gpu_seconds_total{rank, group, group_desc}``: time on the GPU from
  each launch's start to its end, where the ring has the GPU's times (``keep/gpu_clock.py``),
  counted once both are read (``live.tally``); a late rank's GPU shows short here, the ranks
  that wait for it long;
* ``autoannot_straggler_wait_seconds{rank, group, group_desc}``: how long the others wait for a
  rank that stands out as a straggler (the median over the windows it was named by, the
  watcher's rule: ``analysis.stragglers``; the series is there from when it is named until it
  is said to no longer stand out);
* ``autoannot_hang_culprit_rank``: the rank a hang waits on, -1 while none.

``group`` is torch's name of the group; ``group_desc`` what it is called: its description, or
where it has none, its ranks (``[0, 2]``; ``names.group_desc``).

From rings (a folder of this host) the counts are the watcher's own, from when it started: a
launch that left a ring before a look saw it (more than the ring's launches between two looks)
is not counted, and said once. Through a store (``AUTOANNOT_WATCH_STORE``), each rank
publishes its own totals (the same ``live.tally``, counted in its process from its
ring's opening), and the counters move by what they grew, at the watcher's reads of the ranks'
documents (a quarter of its time at most).
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
                                ["rank", "group", "group_desc", "collective"],
                                registry=self.registry)
        self.seconds = Counter("autoannot_collective_seconds", "Time from a collective's "
                               "entry to its return", ["rank", "group", "group_desc"],
                               registry=self.registry)
        self.gpu_seconds = Counter("autoannot_collective_gpu_seconds", "Time on the GPU from "
                                   "a collective's start to its end",
                                   ["rank", "group", "group_desc"], registry=self.registry)
        self.straggler = Gauge("autoannot_straggler_wait_seconds", "How long the others wait "
                               "for a rank that stands out as a straggler (median)",
                               ["rank", "group", "group_desc"], registry=self.registry)
        self.culprit = Gauge("autoannot_hang_culprit_rank", "The rank a hang waits on; -1: none",
                             registry=self.registry)
        self.culprit.set(-1)
        self.say = say
        self._tallies: dict[Path, Any] = {}  # ring -> its ``tally.Tally``
        self._published: dict[tuple[str, str, str], float] = {}  # what a store's ranks said
        self._lost_said = False
        self._stragglers: set[tuple[str, str, str]] = set()

    def update(self, folder: Path) -> None:
        """Count what each ring entered, and what returned, since the last update."""
        from autoannot.live.tally import Tally

        for path in ring_files.in_folder(folder):
            tally = self._tallies.get(path)
            if tally is None:
                tally = self._tallies[path] = Tally()
            try:
                launches, seconds = tally.update(path)
            except (files.TraceError, ValueError, KeyError):
                continue
            rank = str(tally.rank)
            for (group, collective), n in launches.items():
                self.launches.labels(rank, group, tally.called.get(group, ""), collective).inc(n)
            for group, took in seconds.items():
                self.seconds.labels(rank, group, tally.called.get(group, "")).inc(took)
            for group, took in tally.gpu_added.items():
                self.gpu_seconds.labels(rank, group, tally.called.get(group, "")).inc(took)
            if tally.lost and self.say and not self._lost_said:
                self._lost_said = True
                self.say(f"autoannot watch: {path.name} entered more than its launches "
                         "between two looks: metrics count from the launches it still holds")

    def update_published(self, documents: list[dict[str, Any]]) -> None:
        """Move the counters by what each rank's published totals (``live.publish``: its
        ring's ``Tally``, from every host) grew since they were last read; a total that fell
        (the rank's process began anew) counts from zero."""
        for document in documents:
            rank = str(document.get("rank"))
            for group, totals in (document.get("totals") or {}).items():
                called = str(totals.get("called") or "")
                for collective, n in (totals.get("launches") or {}).items():
                    self._grow(self.launches.labels(rank, group, called, collective),
                               (rank, group, collective), float(n))
                self._grow(self.seconds.labels(rank, group, called), (rank, group, ""),
                           float(totals.get("seconds", 0.0)))
                if "gpu_seconds" in totals:
                    self._grow(self.gpu_seconds.labels(rank, group, called),
                               (rank, group, "(gpu seconds)"), float(totals["gpu_seconds"]))

    def _grow(self, counter: Any, key: tuple[str, str, str], total: float) -> None:
        before = self._published.get(key, 0.0)
        if total < before:
            before = 0.0
        if total > before:
            counter.inc(total - before)
        self._published[key] = total

    def hang(self, culprit: int | None) -> None:
        self.culprit.set(-1 if culprit is None else culprit)

    def stragglers(self, found: dict[tuple[int, str], Any]) -> None:
        """Set the straggler gauge of each rank named a straggler (``found``: (rank, group) ->
        its ``stragglers.Straggler``); remove the others'."""
        now = set()
        for (rank, group), straggler in found.items():
            labels = (str(rank), group, straggler.called)
            now.add(labels)
            self.straggler.labels(*labels).set(straggler.late_by_us / 1e6)
        for gone in self._stragglers - now:
            self.straggler.remove(*gone)
        self._stragglers = now

    def serve(self, port: int, address: str = "0.0.0.0") -> Any:
        """Serve the metrics over HTTP on ``port`` of ``address`` (every interface by default,
        as prometheus-client does: a scraper on another host reads it), in a daemon thread;
        the server."""
        from prometheus_client import start_http_server

        return start_http_server(port, addr=address, registry=self.registry)


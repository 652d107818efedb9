"""What a ring's launches add up to, counted as the ring fills: per group, the launches of
each collective, and the time from each launch's entry to its return (a blocking call's
completion: gloo's, and any ``async_op=False`` call on the CPU; for a Work or a GPU stream, its
issue; none for a graph replay's launches, which share the replay's), each launch counted once,
once it returned. Read again and again (``update``), a tally
reads only what the ring entered since, and the launches still running the last time.

The figures of the live watch's metrics (``live.metrics``: from rings of this host) and of
the progress each rank publishes (``live.publish``: through a store, from every host) are
these, so both say the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoannot.describe import vocabulary as V
from autoannot.traces import names
from autoannot.traces.read import ring_files
from autoannot.traces.read.rank_files import group_ranks


class Tally:
    """The running figures of one ring. ``launches[(group, collective)]`` and
    ``seconds[group]``: totals since the tally's first read (or since the ring's run began
    anew); ``called[group]``: what the group is called (``names.group_desc``: its
    description, or its ranks); ``rank``: the ring's; ``lost``: whether more launches than the
    ring holds came between two reads (those written over were not counted)."""

    def __init__(self) -> None:
        self.launches: dict[tuple[str, str], int] = {}
        self.seconds: dict[str, float] = {}
        self.called: dict[str, str] = {}
        self.lost = False
        self.rank: int | None = None  # the ring's rank, once read
        self._next = 0  # the first launch not yet counted
        self._open: dict[int, str] = {}  # launches counted, not yet returned -> their group

    def update(self, path: Path) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        """Count what the ring entered, and what returned, since the last update; what was
        added (launches, seconds), as the totals hold them."""
        head = ring_files.read(path, 0)
        count, capacity = head.count, int(head.meta["capacity"])
        start, pending = self._next, self._open
        if count < start:  # (a new run wrote this file anew)
            start = 0
            pending.clear()
        low = min([start, *pending])
        if count - low > capacity:
            self.lost = self.lost or count - start > capacity
            low = max(low, count - capacity)
            start = max(start, low)
            pending = self._open = {i: g for i, g in pending.items() if i >= low}
        one = ring_files.read(path, count - low)
        while one.count - len(one.records) > low and len(one.records) < capacity:
            # (it entered more between the two reads: the last ``count - low`` records no
            # longer reach back to ``low``; read again, from there)
            one = ring_files.read(path, min(capacity, one.count - low))
        launches: dict[tuple[str, str], int] = {}
        seconds: dict[str, float] = {}
        first = one.count - len(one.records)
        records = one.records
        kinds = one.kinds
        for k in range(len(records)):
            index = first + k
            if index < start and index not in pending:
                continue
            kind = kinds.get(int(records["kind"][k]))
            if kind is None:
                continue
            group = str(kind["group"])
            if group not in self.called:
                annotation = kind.get("annotation") or {}
                self.called[group] = names.group_desc(annotation.get(V.PG_DESC),
                                                      group_ranks(annotation))
            if index >= start:
                collective = str((kind.get("annotation") or {}).get("Collective name",
                                                                    kind["api"]))
                launches[(group, collective)] = launches.get((group, collective), 0) + 1
            ended = int(records["returned_ns"][k])
            if "graph" in kind:  # (a graph replay's launch: its return is the replay's, shared
                pending.pop(index, None)  # by the graph's launches: no time of its own)
            elif ended > 0:
                took = max(0, ended - int(records["entered_ns"][k])) / 1e9
                seconds[group] = seconds.get(group, 0.0) + took
                pending.pop(index, None)
            elif ended == 0:
                pending[index] = group
            else:  # (raised)
                pending.pop(index, None)
        self._next = one.count
        self.rank = one.rank
        for key, n in launches.items():
            self.launches[key] = self.launches.get(key, 0) + n
        for group, took in seconds.items():
            self.seconds[group] = self.seconds.get(group, 0.0) + took
        return launches, seconds

    def totals(self) -> dict[str, dict[str, Any]]:
        """The totals by group, as a rank publishes them: ``{group: {"launches":
        {collective: n}, "seconds": s, "called": what it is called}}``."""
        found: dict[str, dict[str, Any]] = {}

        def of(group: str) -> dict[str, Any]:
            return found.setdefault(group, {"launches": {}, "seconds": 0.0,
                                            "called": self.called.get(group, "")})

        for (group, collective), n in self.launches.items():
            of(group)["launches"][collective] = n
        for group, took in self.seconds.items():
            of(group)["seconds"] = round(took, 6)
        return found

"""What a ring's launches add up to, counted as the ring fills: per group, the launches of
each collective, and the time from each launch's entry to its return (a blocking call's
completion: gloo's, and any ``async_op=False`` call on the CPU; for a Work or a GPU stream, its
issue; none for a graph replay's launches, which share the replay's), each launch counted once,
once it returned; and, where the ring has the GPU's times (``keep/gpu_clock.py``), the time
on the GPU from each launch's start to its end, counted once both are read (launches whose
GPU end is to be had: eager calls whose stream waits for the collective, a graph's with
``AUTOANNOT_GPU_GRAPH_ENDS``; one with no end read within ``GPU_WAIT`` launches of it is not
counted). Read again and again (``update``), a tally reads only what the ring entered since,
and the launches still running (or whose GPU end is still to come) the last time.

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

#: A launch's GPU end is looked for while it is one of the ring's last this many launches.
GPU_WAIT = 1024


class Tally:
    """The running figures of one ring. ``launches[(group, collective)]`` and
    ``seconds[group]``: totals since the tally's first read (or since the ring's run began
    anew); ``called[group]``: what the group is called (``names.group_desc``: its
    description, or its ranks); ``rank``: the ring's; ``lost``: whether more launches than the
    ring holds came between two reads (those written over were not counted);
    ``gpu_seconds[group]``: the GPU's time in the group's collectives, where the ring has it,
    and ``gpu_added`` what the last update added to it."""

    def __init__(self) -> None:
        self.launches: dict[tuple[str, str], int] = {}
        self.seconds: dict[str, float] = {}
        self.called: dict[str, str] = {}
        self.lost = False
        self.rank: int | None = None  # the ring's rank, once read
        self._next = 0  # the first launch not yet counted
        self._open: dict[int, str] = {}  # launches counted, not yet returned -> their group
        self.gpu_seconds: dict[str, float] = {}
        self.gpu_added: dict[str, float] = {}
        self._gpu_open: dict[int, str] = {}  # launches started on the GPU, no end read yet

    def update(self, path: Path) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        """Count what the ring entered, and what returned, since the last update; what was
        added (launches, seconds), as the totals hold them."""
        head = ring_files.read(path, 0)
        count, capacity = head.count, int(head.meta["capacity"])
        start, pending = self._next, self._open
        if count < start:  # (a new run wrote this file anew)
            start = 0
            pending.clear()
            self._gpu_open.clear()
        gpu_open = self._gpu_open = {i: g for i, g in self._gpu_open.items()
                                     if i >= count - GPU_WAIT}
        low = min([start, *pending, *gpu_open])
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
        gpu_added: dict[str, float] = {}
        first = one.count - len(one.records)
        records = one.records
        kinds = one.kinds
        gpu = one.gpu
        for k in range(len(records)):
            index = first + k
            if index < start and index not in pending and index not in gpu_open:
                continue
            kind = kinds.get(int(records["kind"][k]))
            if kind is None:
                continue
            if gpu is not None and (index >= start or index in gpu_open):
                started_ns, ended_ns = int(gpu["start_ns"][k]), int(gpu["end_ns"][k])
                if started_ns > 0 and ended_ns > 0:
                    group = str(kind["group"])
                    gpu_added[group] = gpu_added.get(group, 0.0) + max(
                        0, ended_ns - started_ns) / 1e9
                    gpu_open.pop(index, None)
                elif index >= start:  # (its GPU times may come: looked for again)
                    gpu_open[index] = str(kind["group"])
            if index < start and index not in pending:
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
        for group, took in gpu_added.items():
            self.gpu_seconds[group] = self.gpu_seconds.get(group, 0.0) + took
        self.gpu_added = gpu_added
        return launches, seconds

    def totals(self) -> dict[str, dict[str, Any]]:
        """The totals by group, as a rank publishes them: ``{group: {"launches":
        {collective: n}, "seconds": s, "called": what it is called}}``, and ``"gpu_seconds"``
        where the ring has the GPU's times of the group's launches."""
        found: dict[str, dict[str, Any]] = {}

        def of(group: str) -> dict[str, Any]:
            return found.setdefault(group, {"launches": {}, "seconds": 0.0,
                                            "called": self.called.get(group, "")})

        for (group, collective), n in self.launches.items():
            of(group)["launches"][collective] = n
        for group, took in self.seconds.items():
            of(group)["seconds"] = round(took, 6)
        for group, took in self.gpu_seconds.items():
            of(group)["gpu_seconds"] = round(took, 6)
        return found

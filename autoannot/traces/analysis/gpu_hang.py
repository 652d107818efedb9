"""A hang on the GPU, named from the ranks' GPU times (``keep/gpu_clock.py``): the hosts have
all entered collective N (an NCCL call returns once its work is queued), and one rank's GPU
never started it while the others' GPUs started it and wait in it; or, one rank alone, a
graph's replay whose GPU sits before its k-th collective. Read from each ring's GPU file: its
clock's oldest timed launch not started on the GPU, and the others' GPU starts of the same
collective. Live (the watch), said only where that rank's clock looked lately (a rank whose
process is gone is the host rule's) and the launch has waited ``after_s`` at least; from the
files a job left (``check``), where it had waited that long at the clock's last look."""

from __future__ import annotations

import time
from dataclasses import dataclass

from autoannot.traces import names
from autoannot.traces.read import ring_files
from autoannot.traces.read.rank_files import group_ranks

#: From the files a job left: a GPU that had waited this long before a launch its host entered
#: (the watch's default stall).
OFFLINE_AFTER_S = 5.0
#: A rank's clock that has not looked for this long says nothing (its process is gone or stuck).
LOOKED_WITHIN_S = 5.0


@dataclass(frozen=True)
class GpuWait:
    """A rank whose GPU has not started a launch its host entered: the launch's group, seq,
    what it is, its call site, when its host entered it (the rank's monotonic ns and the wall
    clock's), and for a replay's launch its graph, its index there and how many it has."""

    rank: int
    group: str
    seq: int
    collective: str
    label: str
    site: str | None
    entered_ns: int
    entered_wall_ns: int
    graph: str | None = None
    index: int | None = None
    of: int | None = None


def waits_of(reads: list[ring_files.RingRead], after_s: float, now_ns: int | None = None,
             live: bool = True) -> list[GpuWait]:
    """The ranks whose GPU has not started a launch entered ``after_s`` ago or more (``live``
    False: at their clock's last look, whenever that was)."""
    now_ns = time.monotonic_ns() if now_ns is None else now_ns
    found = []
    for one in reads:
        state = one.gpu_state
        if one.rank is None or state is None or state.waiting is None:
            continue
        at_ns = now_ns if live else state.looked_ns
        if ((live and now_ns - state.looked_ns > LOOKED_WITHIN_S * 1e9)
                or at_ns - state.waiting_entered_ns < after_s * 1e9):
            continue
        at = state.waiting - (one.count - len(one.records))
        if not 0 <= at < len(one.records):
            continue
        record = one.records[at]
        kind = one.kinds.get(int(record["kind"]))
        if kind is None:
            continue
        annotation = kind.get("annotation") or {}
        ranks = group_ranks(annotation)
        desc = annotation.get("Process Group Description")
        found.append(GpuWait(
            int(one.rank), str(kind["group"]), int(record["seq"]),
            str(annotation.get("Collective name", kind.get("api", "?"))),
            names.group_label(str(kind["group"]), desc, ranks),
            one.sites.get(int(record["site"])), state.waiting_entered_ns,
            int(one.wall_ns(state.waiting_entered_ns)), kind.get("graph"), kind.get("index"),
            kind.get("of")))
    return found


def lines_of(reads: list[ring_files.RingRead], after_s: float, now_ns: int | None = None,
             live: bool = True) -> list[str]:
    """The hang's lines where a rank's GPU waits before a launch (empty: none); ``live`` False:
    from the files a job left, as they were at each clock's last look."""
    now_ns = time.monotonic_ns() if now_ns is None else now_ns
    waits = waits_of(reads, after_s, now_ns, live)
    if not waits:
        return []
    said = []
    for wait in waits:
        started, ended = _others(reads, wait)
        looked = next(one.gpu_state.looked_ns for one in reads if one.rank == wait.rank)
        ago = ((now_ns if live else looked) - wait.entered_ns) / 1e9
        when = time.strftime("%H:%M:%S", time.localtime(wait.entered_wall_ns / 1e9))
        what = f"{wait.collective} #{wait.seq} of group {wait.label}"
        if wait.graph is not None:
            place = (f"collective {wait.index + 1} of the {wait.of} of graph {wait.graph} "
                     f"({what}, captured at {wait.site})" if wait.index is not None else
                     f"a collective of graph {wait.graph} ({what}, captured at {wait.site})")
            entered = f"replayed at {when}, {ago:.1f} s " + ("ago" if live else
                                                              "before its GPU was last seen")
        else:
            place = what + (f" (called at {wait.site})" if wait.site else "")
            entered = f"which its host entered at {when}, {ago:.1f} s " + (
                "ago" if live else "before its GPU was last seen")
        line = (f"HANG: rank {wait.rank} holds the job up: its GPU has not started {place}, "
                f"{entered}")
        waiting = [r for r in started if r not in ended]
        if len(waiting) == 1:
            line += f"; rank {waiting[0]}'s GPU started it and waits"
        elif waiting:
            line += f"; the GPUs of ranks {_list(waiting)} started it and wait"
        if ended:
            line += f"; {'rank' if len(ended) == 1 else 'ranks'} {_list(ended)} ended it"
        said.append(line + " (from the GPU's times)")
    return said


def _others(reads: list[ring_files.RingRead], wait: GpuWait) -> tuple[list[int], list[int]]:
    """The other ranks whose GPU started ``wait``'s launch, and those whose GPU ended it."""
    started, ended = [], []
    for one in reads:
        if one.rank is None or one.rank == wait.rank or one.gpu is None:
            continue
        records = one.records
        for i in range(len(records) - 1, -1, -1):
            if int(records["seq"][i]) != wait.seq:
                continue
            kind = one.kinds.get(int(records["kind"][i]))
            if kind is None or str(kind["group"]) != wait.group:
                continue
            if one.gpu["start_ns"][i] > 0:
                started.append(int(one.rank))
                if one.gpu["end_ns"][i] > 0:
                    ended.append(int(one.rank))
            break
    return sorted(started), sorted(ended)


def _list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))

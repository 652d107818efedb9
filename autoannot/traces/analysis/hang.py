"""A hang's culprit: who waits on whom, from what each rank last entered on each group.

A collective instance (a group, a place in its sequence) completes only once every member
rank has entered it. So a rank that entered a group's #s waits on every member whose last
entry on that group is below s (or who has none): an edge of the *wait-for graph*, through
that group, at the first instance the other never entered. A rank that others wait on and
that waits on none entered nothing it is stuck in: it stopped, or it is stuck outside any
collective — the *culprit*. Every other rank that waits is *blocked*, on a culprit through
the edges; ranks that wait on each other with no culprit among them are a *cycle* (a
deadlock: the ranks entered the groups' collectives in different orders).

The input is small and the same wherever it comes from (rows or record files read after
the job; a live job's reports): per group, its member ranks and each rank's last seq
entered. What an instance was (its collective, call site, step, time) is asked of the caller
only for what is said (``describe``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autoannot.traces import names


@dataclass
class GroupProgress:
    """What the ranks of one group last entered: ``entered`` maps a rank to the highest seq of
    the group it launched; ``members`` are all of the group's ranks where known (None: only
    ``size`` is known, and the ranks that entered nothing are unnamed)."""

    name: str
    desc: str
    size: int
    members: tuple[int, ...] | None
    entered: dict[int, int]
    first: int = 0  # the group's first seq in the inputs
    finished: int = -1  # the highest seq known finished (a rank's part of it ended)


@dataclass(frozen=True)
class Wait:
    """``rank`` waits on ``on`` in group ``group`` at ``seq``: the first instance of the group
    that rank entered and they never did (``seq`` None: they entered nothing of the group)."""

    rank: int
    group: str
    seq: int | None
    on: tuple[int, ...]


@dataclass
class Hang:
    """The wait-for graph's answer: the culprits (ranks waited on that wait on none), each
    blocked rank's waits, and cycles of ranks that wait on each other with no culprit."""

    culprits: list[int]
    waits: dict[int, list[Wait]]  # each blocked rank's waits, by group
    held_up: dict[int, list[int]] = field(default_factory=dict)  # culprit -> ranks it holds up
    cycles: list[list[int]] = field(default_factory=list)
    unnamed: dict[str, int] = field(default_factory=dict)  # group -> members never named


def wait_for(groups: list[GroupProgress]) -> Hang | None:
    """The wait-for graph of the ranks over ``groups``, and its culprits; None where no rank
    waits on another (every instance entered was entered by every member: no hang to
    explain). Where one does, a chain of waits ends at a culprit or in a cycle: the answer
    names one or the other."""
    waits: dict[int, list[Wait]] = {}
    unnamed: dict[str, int] = {}
    anywhere = {r for g in groups for r in g.entered}
    for g in groups:
        if not g.entered:
            continue
        # a member with no record of any collective is waited on only where the group never
        # went past its first instance (it never started); past it, it took part and its
        # files are lost (said as missing, not as a hang)
        at_first = max(g.entered.values()) <= g.first
        members = tuple(m for m in (g.members if g.members is not None
                                    else sorted(g.entered))
                        if m in anywhere or at_first)
        if g.members is None and len(g.entered) < g.size and at_first:
            unnamed[g.name] = g.size - len(g.entered)
        behind: dict[int | None, list[int]] = {}  # a seq, and the members whose last it is
        for m in members:
            last = g.entered.get(m)
            if g.finished >= g.first:  # (an instance some rank finished had every member)
                last = g.finished if last is None else max(last, g.finished)
            behind.setdefault(last, []).append(m)
        for rank, seq in g.entered.items():
            on: dict[int | None, list[int]] = {}
            for last, who in behind.items():
                if last is None or last < seq:
                    on.setdefault(None if last is None else last + 1, []).extend(who)
            for first, who in sorted(on.items(), key=lambda item: (item[0] is not None,
                                                                   item[0] or 0)):
                waits.setdefault(rank, []).append(Wait(rank, g.name, first, tuple(sorted(who))))
    if not waits and not unnamed:
        return None
    waited_on = {m for ws in waits.values() for w in ws for m in w.on}
    culprits = sorted(m for m in waited_on if m not in waits)
    held_up: dict[int, list[int]] = {}
    for culprit in culprits:
        held_up[culprit] = sorted(_waiting_on(culprit, waits))
    explained = {r for held in held_up.values() for r in held}
    cycles = _cycles({r: ws for r, ws in waits.items() if r not in explained})
    return Hang(culprits, waits, held_up, cycles, unnamed)


def _waiting_on(culprit: int, waits: dict[int, list[Wait]]) -> set[int]:
    """The ranks that wait on ``culprit``, directly or through others."""
    by_target: dict[int, set[int]] = {}
    for rank, ws in waits.items():
        for w in ws:
            for m in w.on:
                by_target.setdefault(m, set()).add(rank)
    found: set[int] = set()
    frontier = [culprit]
    while frontier:
        nxt = []
        for m in frontier:
            for r in by_target.get(m, ()):
                if r not in found:
                    found.add(r)
                    nxt.append(r)
        frontier = nxt
    found.discard(culprit)
    return found


def _cycles(waits: dict[int, list[Wait]]) -> list[list[int]]:
    """The strongly connected sets of two or more ranks among those that wait and reach no
    culprit (Tarjan's algorithm, iterative)."""
    graph = {r: sorted({m for w in ws for m in w.on if m in waits}) for r, ws in waits.items()}
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    found: list[list[int]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, at = work.pop()
            if at == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            edges = graph[node]
            if at < len(edges):
                work.append((node, at + 1))
                nxt = edges[at]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                part = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    part.append(top)
                    if top == node:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(found)


# --- what is said of it -------------------------------------------------------------------------

#: The most lines of blocked ranks said in a lead (the rest are counted, and in --json).
BLOCKED_LINES = 6


@dataclass(frozen=True)
class Launch:
    """What a caller says of one rank's launch at one place of a group's sequence."""

    collective: str
    call_site: str | None = None
    step: int = -1
    start_us: float | None = None


def lines(hang: Hang, groups: list[GroupProgress],
          describe: Callable[[str, int, int], Launch | None],
          rank_list: Callable[[list[int]], str]) -> list[str]:
    """The lead of a hang: a line per culprit (its last launch, as ``describe(group, seq,
    rank)`` says it), then the blocked ranks, a line per place they wait at (at most
    ``BLOCKED_LINES``), and cycles."""
    by_name = {g.name: g for g in groups}
    said: list[str] = []
    for culprit in hang.culprits:
        held = hang.held_up.get(culprit, [])
        last = last_launch(culprit, groups, describe)
        who = (f"{rank_list(held)} {'waits' if len(held) == 1 else 'wait'} on it"
               if len(held) < 9 else f"{len(held)} ranks wait on it")
        if last is None:
            said.append(f"HANG: rank {culprit} holds the job up: {who}, directly or through "
                        "others, and it left no record of any collective (it never started, "
                        "or its files are missing)")
            continue
        group, seq, launch = last
        said.append(
            f"HANG: rank {culprit} holds the job up: {who}, directly or through others, and it "
            f"waits on none. Its last launch was {launch.collective} #{seq} of group "
            f"{_group_name(by_name[group])}" + (f" (step {launch.step})" if launch.step >= 0
                                               else "")
            + (f" at {launch.call_site}" if launch.call_site else "")
            + ", complete (every member entered it); it entered no collective after: it "
            "stopped, or it is stuck outside any collective"
            + _silent_for(launch, held, groups, describe))
    for cycle in hang.cycles:
        said.append(f"HANG: {rank_list(cycle)} wait on each other (a deadlock: they entered "
                    "their groups' collectives in different orders)")
    for group, unnamed in sorted(hang.unnamed.items()):
        said.append(f"HANG: {unnamed} of group {_group_name(by_name[group])}'s ranks entered "
                    "none of its collectives and are not named by these inputs")
    # blocked ranks: one line per place they wait at (their wait on a culprit first)
    culprits = set(hang.culprits)
    places: dict[tuple[str, int | None, tuple[int, ...]], list[int]] = {}
    for rank, ws in sorted(hang.waits.items()):
        chosen = min(ws, key=lambda w: (not culprits.intersection(w.on), w.seq is None,
                                        w.seq or 0, w.group))
        places.setdefault((chosen.group, chosen.seq, chosen.on), []).append(rank)
    ordered = sorted(places.items(), key=lambda item: (-len(item[1]), item[0][0],
                                                       item[0][1] or 0))
    for (group, seq, on), ranks in ordered[:BLOCKED_LINES]:
        g = by_name[group]
        if seq is None:
            said.append(f"  blocked: {rank_list(ranks)} in group {_group_name(g)}, of which "
                        f"{rank_list(list(on))} entered no collective")
            continue
        launch = describe(group, seq, ranks[0])
        what = f"{launch.collective} #{seq}" if launch else f"#{seq}"
        at = f" at {launch.call_site}" if launch and launch.call_site else ""
        said.append(f"  blocked: {rank_list(ranks)} in {what} of group {_group_name(g)}{at}, "
                    f"which {rank_list(list(on))} never entered")
    rest = ordered[BLOCKED_LINES:]
    if rest:
        more = sum(len(r) for _, r in rest)
        said.append(f"  ... and {more} more blocked ranks at {len(rest)} other places "
                    "(--json lists every wait)")
    return said


#: The most ranks held up whose last launch is read to say how long a culprit was silent.
SILENCE_SAMPLE = 8


def _silent_for(launch: Launch, held: list[int], groups: list[GroupProgress],
                describe: Callable[[str, int, int], Launch | None]) -> str:
    """', N s before the last launch of a rank it holds up' where times are known (of up to
    ``SILENCE_SAMPLE`` of them): how long it has entered nothing while the others went on."""
    if launch.start_us is None:
        return ""
    latest = [found[2].start_us for rank in held[:SILENCE_SAMPLE]
              if (found := last_launch(rank, groups, describe)) is not None
              and found[2].start_us is not None]
    if not latest or max(latest) <= launch.start_us:
        return ""
    gap = (max(latest) - launch.start_us) / 1e6
    said = f"{gap:.3g} s" if gap >= 1 else f"{gap * 1e3:.3g} ms"
    return f"; the ranks it holds up launched for {said} after it"


def last_launch(rank: int, groups: list[GroupProgress],
                describe: Callable[[str, int, int], Launch | None]
                ) -> tuple[str, int, Launch] | None:
    """A rank's last launch over its groups: (group, seq, what it was), the latest by its
    start where times are known."""
    found = []
    for g in groups:
        seq = g.entered.get(rank)
        if seq is None:
            continue
        launch = describe(g.name, seq, rank)
        if launch is not None:
            found.append((g.name, seq, launch))
    if not found:
        return None
    return max(found, key=lambda f: (f[2].start_us is not None,
                                     f[2].start_us if f[2].start_us is not None else 0.0))


def as_json(hang: Hang, groups: list[GroupProgress],
            describe: Callable[[str, int, int], Launch | None]) -> dict[str, Any]:
    """The hang for ``--json``: the culprits with their last launch and the ranks they hold
    up, every wait, the cycles."""
    culprits = []
    for culprit in hang.culprits:
        last = last_launch(culprit, groups, describe)
        culprits.append({
            "rank": culprit, "holds_up": hang.held_up.get(culprit, []),
            "last_launch": None if last is None else {
                "group": last[0], "seq": last[1], "collective": last[2].collective,
                "call_site": last[2].call_site, "step": last[2].step}})
    return {"culprits": culprits, "cycles": hang.cycles, "unnamed": hang.unnamed,
            "waits": [{"rank": w.rank, "group": w.group, "seq": w.seq, "on": list(w.on)}
                      for ws in hang.waits.values() for w in ws]}


def _group_name(g: GroupProgress) -> str:
    return names.group_label(g.name, g.desc, g.members)

"""A live job's hang, named while it hangs: the culprit and who waits on it, from the ranks'
rings (``AUTOANNOT_RING``) as the job writes them.

A watcher looks at the rings' headers every ``interval`` seconds (64 bytes a rank: how many
launches each entered). Once no rank has entered a launch for ``stall`` seconds it reads the
rings whole and runs the hang analysis ``check`` runs (``sequences.hang_of``: who waits on
whom, over each rank's last launches per group); a hang is said once, and that the job moves
again once it does. A job that only pauses (every rank computing, no collective half-entered)
has no rank waiting on another: nothing is said.

Run by rank 0 of a job (``AUTOANNOT_WATCH=1``: ``keep/watch_thread.py``) or by
``autoannot watch FOLDER``. The rings must be on the watcher's host (or a file system that
shares writes to mapped files at once: a local disk, tmpfs; not NFS). Across hosts the ranks
publish their progress to a c10d store (``AUTOANNOT_WATCH_STORE``, ``keep/publish.py``) and
the watcher reads it there (``StoreProgress``): the same hang analysis and straggler window,
from each rank's last launches per group.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoannot.base import ring_format as ring
from autoannot.traces import files
from autoannot.traces.read import ring_files

#: Each rank's last launches per group read to describe a hang (its last, and the few before).
LAST_PER_GROUP = 4


@dataclass
class Verdict:
    """What a look at the rings found: the hang's lead lines (empty: none), the ranks read
    (by rank: launches entered so far), the run, and what could not be read."""

    lines: list[str]
    counts: dict[int, int]
    run: str | None = None
    notes: list[str] = field(default_factory=list)


def counts_of(folder: Path) -> dict[Path, int]:
    """How many launches each ring in ``folder`` entered so far (its header alone)."""
    found = {}
    for path in ring_files.in_folder(folder):
        try:
            with open(path, "rb") as f:
                head = f.read(ring.HEADER_BYTES)
        except OSError:
            continue
        if len(head) == ring.HEADER_BYTES and head[:8] == ring.MAGIC:
            found[path] = ring.COUNT.unpack_from(head, ring.COUNT_AT)[0]
    return found


def verdict(folder: Path) -> Verdict:
    """The rings in ``folder`` read whole: the hang they show, if any (of the newest run
    where the folder holds rings of several; the others said in ``notes``)."""
    from autoannot.traces.analysis import sequences as S

    reads, notes = [], []
    for path in ring_files.in_folder(folder):
        try:
            reads.append(ring_files.read(path))
        except (files.TraceError, ValueError) as exc:
            notes.append(f"{path}: not read ({exc})")
    if not reads:
        return Verdict([], {}, None, notes or [f"{folder}: no ring files (*{ring.SUFFIX})"])
    newest = max(reads, key=lambda r: r.meta.get("wall_ns", 0)).meta.get("run")
    others = sorted({str(r.meta.get("run")) for r in reads if r.meta.get("run") != newest})
    if others:
        notes.append(f"rings of other runs left out ({', '.join(others)}): read run {newest}")
    reads = [r for r in reads if r.meta.get("run") == newest and r.rank is not None]
    members: S.Members = {}
    by_seq: dict[str, dict[int, dict[int, S.Step]]] = {}
    for one in reads:
        _last_steps(one, by_seq, members)
    return Verdict(S.hang_of({}, members, by_seq), {r.rank: r.count for r in reads},
                   newest, notes)


def _last_steps(one: ring_files.RingRead, by_seq: dict[str, dict[int, dict[int, Any]]],
                members: Any) -> None:
    """A ring's last ``LAST_PER_GROUP`` launches of each group, as ``check``'s steps."""
    from autoannot.traces.analysis import sequences as S

    records = one.records
    seen: dict[str, int] = {}
    wall = one.wall_ns(records["entered_ns"])
    for i in range(len(records) - 1, -1, -1):
        kind = one.kinds.get(int(records["kind"][i]))
        if kind is None:
            continue
        group = kind["group"]
        if seen.get(group, 0) >= LAST_PER_GROUP:
            continue
        seen[group] = seen.get(group, 0) + 1
        annotation = kind["annotation"]
        if group not in members:
            S.note_members(members, group, annotation)
        site = one.sites.get(int(records["site"][i]))
        by_seq.setdefault(group, {}).setdefault(one.rank, {})[int(records["seq"][i])] = (
            S.step_of(annotation, site, int(wall[i])))


#: The launches of each ring read to look for stragglers (the tail: 32 bytes each).
TAIL = 1024


def stragglers_of(folder: Path, tail: int = TAIL) -> dict[tuple[int, str], tuple[Any, str]]:
    """The ranks that stand out as stragglers in the rings of ``folder`` (their last ``tail``
    launches; ``analysis.stragglers``): (rank, group) -> (the ``Straggler``, its line)."""
    import numpy as np

    from autoannot.traces.analysis import stragglers
    from autoannot.traces.read.rank_files import group_ranks

    reads = []
    for path in ring_files.in_folder(folder):
        try:
            reads.append(ring_files.read(path, tail))
        except (files.TraceError, ValueError):
            continue
    if not reads:
        return {}
    newest = max(reads, key=lambda r: r.meta.get("wall_ns", 0)).meta.get("run")
    entered: dict[str, dict[int, dict[int, float]]] = {}
    gaps: dict[str, dict[int, dict[int, float]]] = {}  # (its time outside collectives before)
    members: dict[str, tuple[int, ...]] = {}
    named: dict[str, str] = {}
    sites: dict[tuple[str, int], str] = {}  # (group, rank) -> its last call site there
    clocks: dict[int, str | None] = {}  # rank -> its host (its monotonic clock's)
    for one in reads:
        if one.meta.get("run") != newest or one.rank is None:
            continue
        clocks[one.rank] = one.meta.get("host")
        records = one.records
        at_us = records["entered_ns"] / 1e3
        ended = records["returned_ns"].astype(float)
        ended[ended <= 0] = np.nan  # (still running, or raised)
        outside_us = np.full(len(records), np.nan)
        outside_us[1:] = (records["entered_ns"][1:] - ended[:-1]) / 1e3
        outside_us[outside_us < 0] = np.nan  # (a replay's launches: entered as one, unknown)
        for k, kind in one.kinds.items():
            annotation = kind.get("annotation") or {}
            group = kind["group"]
            if group not in members and (ranks := group_ranks(annotation)) is not None:
                members[group] = ranks
                desc = annotation.get("Process Group Description")
                named[group] = f"{group} ({desc})" if desc else group
            mine = records["kind"] == k
            if mine.any():
                seqs = records["seq"][mine].tolist()
                entered.setdefault(group, {}).setdefault(one.rank, {}).update(
                    zip(seqs, at_us[mine].tolist(), strict=True))
                gaps.setdefault(group, {}).setdefault(one.rank, {}).update(
                    zip(seqs, outside_us[mine].tolist(), strict=True))
                site = one.sites.get(int(records["site"][mine][-1]))
                if site:
                    sites[(group, one.rank)] = site
    return {(s.rank, s.group): (s, s.line(named.get(s.group, s.group),
                                          sites.get((s.group, s.rank))))
            for s in stragglers.stragglers(entered, members, gaps=gaps, clocks=clocks)}


def culprit_of(lines: list[str]) -> int | None:
    """The first culprit a hang's lead names (``HANG: rank N holds the job up``), or None."""
    for line in lines:
        if line.startswith("HANG: rank "):
            word = line[len("HANG: rank "):].split()[0]
            if word.isdigit():
                return int(word)
    return None


class RingsFolder:
    """What a watcher reads: the rings of a folder of this host."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __str__(self) -> str:
        return f"their rings in {self.folder}"

    def counts(self) -> dict[Any, int]:
        return counts_of(self.folder)

    def verdict(self) -> Verdict:
        return verdict(self.folder)

    def stragglers(self) -> dict[tuple[int, str], tuple[Any, str]]:
        return stragglers_of(self.folder)

    def update_metrics(self, metrics: Any) -> None:
        metrics.update(self.folder)


class StoreProgress:
    """What a watcher reads: the progress the ranks publish to a c10d store
    (``keep.publish``); ``store``: a client of it. At every look each rank's launch count (a
    few dozen bytes a rank); the documents to say a hang, and to look for stragglers no more
    than a quarter of the time (a read of every rank's document takes seconds at 65,536
    ranks: ``benchmarks/store_traffic.py``). Ranks 0, 1, ... are looked for until one has not
    published (a rank that never launched is missing)."""

    def __init__(self, store: Any, label: str, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.store = store
        self.label = label
        self.clock = clock
        self._ranks = 0  # ranks 0 .. _ranks - 1 have published
        self._run: str | None = None
        self._next_straggler_look = 0.0
        self._stragglers: dict[tuple[int, str], tuple[Any, str]] = {}
        self._unmetered: list[dict[str, Any]] | None = None  # documents read, not yet metered

    def __str__(self) -> str:
        return f"the store at {self.label}"

    def counts(self) -> dict[Any, int]:
        key_of = ring.count_key
        while self.store.check([key_of(self._ranks)]):  # (new ranks: one request each)
            self._ranks += 1
        if not self._ranks:
            return {}
        found: dict[int, tuple[int, int, str]] = {}
        for rank, value in enumerate(self.store.multi_get([key_of(r)
                                                           for r in range(self._ranks)])):
            count, published, run = value.decode(errors="replace").split(" ", 2)
            found[rank] = (int(count), int(published), run)
        self._run = max(found.values(), key=lambda f: f[1])[2]  # (the newest run's)
        return {rank: f[0] for rank, f in found.items() if f[2] == self._run}

    def _documents(self) -> list[dict[str, Any]]:
        from autoannot.traces.read import rank_progress

        if not self._ranks:
            return []
        values = self.store.multi_get([ring.progress_key(r) for r in range(self._ranks)])
        documents = [d for d in map(rank_progress.decode, values) if d is not None]
        documents = [d for d in documents if self._run is None or d.get("run") == self._run]
        self._unmetered = documents  # (the metrics' next update)
        return documents

    def verdict(self) -> Verdict:
        from autoannot.traces.analysis import sequences as S
        from autoannot.traces.read import rank_progress

        documents = self._documents()
        members, by_seq, counts = steps_of_documents(documents)
        lines = S.hang_of({}, members, by_seq)
        culprit = culprit_of(lines)
        stale = None if culprit is None else rank_progress.stale_culprit(documents, culprit)
        return Verdict(lines + ([stale] if stale else []), counts, self._run,
                       [] if documents else [f"{self}: no rank has published"])

    def stragglers(self) -> dict[tuple[int, str], tuple[Any, str]]:
        from autoannot.traces.analysis import stragglers
        from autoannot.traces.read import rank_progress

        began = self.clock()
        if began < self._next_straggler_look:
            return self._stragglers
        entered, gaps, members, sites, clocks = rank_progress.tails_of(self._documents())
        self._stragglers = {(s.rank, s.group): (s, s.line(s.group, sites.get((s.group, s.rank))))
                            for s in stragglers.stragglers(entered, members, gaps=gaps,
                                                           clocks=clocks)}
        self._next_straggler_look = began + 4 * (self.clock() - began)
        return self._stragglers

    def update_metrics(self, metrics: Any) -> None:
        """The ranks' published totals, from the documents last read (at most a quarter of
        the watcher's time: ``stragglers``)."""
        documents, self._unmetered = self._unmetered, None
        if documents is not None:
            metrics.update_published(documents)


def steps_of_documents(documents: list[dict[str, Any]]) -> tuple[Any, Any, dict[int, int]]:
    """The hang analysis's inputs from the ranks' documents (``sequences.hang_of``'s members
    and steps by seq), and each rank's launch count."""
    from autoannot.traces.analysis import sequences as S
    from autoannot.traces.read import rank_progress

    members: S.Members = {}
    by_seq: dict[str, dict[int, dict[int, S.Step]]] = {}
    counts = {}
    for document in documents:
        rank = int(document["rank"])
        counts[rank] = int(document["count"])
        for group, held in document["groups"].items():
            size = held.get("size")
            if isinstance(size, int):
                known = members.get(group, (size, None))
                members[group] = (max(size, known[0]), known[1] or rank_progress.members_of(held))
            for seq, what, site, at_ns in held["last"]:
                by_seq.setdefault(group, {}).setdefault(rank, {})[int(seq)] = S.Step(
                    tuple(what), site, at_ns)
    return members, by_seq, counts



class Watcher:
    """Looks at the rings of ``folder`` (``look``; or at a ``StoreProgress``), and says
    (``say``) a hang once no rank has launched for ``stall`` seconds, and that the job moves
    again once it does."""

    def __init__(self, folder: Path | Any, stall: float, say: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, metrics: Any = None) -> None:
        self.source = RingsFolder(folder) if isinstance(folder, Path) else folder
        self.metrics = metrics  # (``traces.metrics.JobMetrics``, updated at each look)
        self.stall = stall
        self.say = say
        self.clock = clock
        self._counts: dict[Path, int] = {}
        self._since = clock()  # when the counts last changed
        self._said: list[str] | None = None  # the hang said, until the job moves
        self._stragglers: dict[tuple[int, str], str] = {}  # (rank, group) -> its line

    def look(self) -> list[str] | None:
        """One look: the hang's lines where one is said now (None otherwise)."""
        now = self.clock()
        counts = self.source.counts()
        if self.metrics is not None:
            self.source.update_metrics(self.metrics)
        if counts != self._counts:
            self._counts, self._since = counts, now
            if self._said is not None:
                self._said = None
                self.say("autoannot watch: the job launches again")
                if self.metrics is not None:
                    self.metrics.hang(None)
            self._look_for_stragglers()
            return None
        if self._said is not None or not counts or now - self._since < self.stall:
            return None
        found = self.source.verdict()
        self._said = found.lines
        if self.metrics is not None:
            self.metrics.hang(culprit_of(found.lines))
        if found.lines:
            self.say(f"autoannot watch: no rank has launched a collective for "
                     f"{now - self._since:.1f} s ({len(found.counts)} ranks, from "
                     f"{self.source}):")
            for line in found.lines:
                self.say(line)
            return found.lines
        return None

    def _look_for_stragglers(self) -> None:
        """Say each rank that now stands out as a straggler (once), and each that no longer
        does."""
        now = self.source.stragglers()
        if self.metrics is not None:
            self.metrics.stragglers({key: found for key, (found, _) in now.items()})
        for key, (_, line) in now.items():
            if key not in self._stragglers:
                self.say(f"autoannot watch: {line}")
        for rank, group in sorted(self._stragglers.keys() - now.keys()):
            self.say(f"autoannot watch: rank {rank} no longer stands out in group {group}")
        self._stragglers = now

    def run(self, interval: float, stop: Any = None) -> None:
        """Look every ``interval`` seconds until ``stop`` (a ``threading.Event``) is set."""
        while stop is None or not stop.is_set():
            self.look()
            if stop is None:
                time.sleep(interval)
            else:
                stop.wait(interval)

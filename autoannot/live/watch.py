"""A live job's hang, named while it hangs: the culprit and who waits on it, from the ranks'
rings (``AUTOANNOT_RING``) as the job writes them.

A watcher looks at the rings' headers every ``interval`` seconds (64 bytes a rank: how many
launches each entered). Once no rank has entered a launch for ``stall`` seconds it reads the
rings whole and runs the hang analysis ``check`` runs (``sequences.hang_of``: who waits on
whom, over each rank's last launches per group); a hang is said once, and that the job moves
again once it does. A job that only pauses (every rank computing, no collective half-entered)
has no rank waiting on another: nothing is said.

Run by rank 0 of a job (``AUTOANNOT_WATCH=1``: ``live/watch_thread.py``) or by
``autoannot watch FOLDER``. The rings must be on the watcher's host (or a file system that
shares writes to mapped files at once: a local disk, tmpfs; not NFS). Across hosts the ranks
publish their progress to a c10d store (``AUTOANNOT_WATCH_STORE``, ``live/publish.py``) and
the watcher reads it there (``StoreProgress``): the same hang analysis and straggler window,
from each rank's last launches per group.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoannot.base import ring_format as ring
from autoannot.live import progress
from autoannot.traces import files, names
from autoannot.traces.analysis import stragglers
from autoannot.traces.read import ring_files

#: A GPU that has not started a launch its host entered this long ago holds the job up (the
#: watch's stall, by default; a GPU that runs behind its host for less is a GPU at work).
GPU_AFTER_S = 5.0
#: Each rank's last launches per group read to describe a hang (its last, and the few before).
LAST_PER_GROUP = 4


@dataclass
class Verdict:
    """What a look at the rings found: the hang's lead lines (empty: none), the ranks read
    (by rank: launches entered so far), the run, what else there is to know (``notes``), and
    what could not be read (``unreadable``: no answer is given about those ranks)."""

    lines: list[str]
    counts: dict[int, int]
    run: str | None = None
    notes: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)


def counts_of(folder: Path) -> tuple[dict[Path, int], dict[Path, str]]:
    """How many launches each ring in ``folder`` entered so far (its header alone), and why
    each ring that cannot be read cannot (no ring's header, cut short, no names beside it)."""
    found, unreadable = {}, {}
    for path in ring_files.in_folder(folder):
        try:
            with open(path, "rb") as f:
                head = f.read(ring.HEADER_BYTES)
                size = os.fstat(f.fileno()).st_size
        except OSError as exc:
            unreadable[path] = str(exc.strerror or exc)
            continue
        if len(head) < ring.HEADER_BYTES or head[:8] != ring.MAGIC:
            unreadable[path] = "not an autoannot ring file of this version"
            continue
        _, record_bytes, capacity = ring.HEADER.unpack_from(head)
        if record_bytes != ring.RECORD.size or size < ring.ring_bytes(capacity):
            unreadable[path] = (f"cut short: {size} of a ring's {ring.ring_bytes(capacity)} "
                                "bytes" if record_bytes == ring.RECORD.size else
                                f"records of {record_bytes} bytes")
            continue
        if not ring_files.names_of(path).is_file():
            unreadable[path] = f"no {ring_files.names_of(path).name} beside it"
            continue
        found[path] = ring.COUNT.unpack_from(head, ring.COUNT_AT)[0]
    return found, unreadable


def verdict(folder: Path, gpu_after_s: float = GPU_AFTER_S) -> Verdict:
    """The rings in ``folder`` read whole: the hang they show, if any (of the newest run
    where the folder holds rings of several; the others said in ``notes``). Where the hosts
    show none, a GPU that has not started a launch its host entered ``gpu_after_s`` ago or
    more (``live.gpu_hang``: from the GPU's times)."""
    from autoannot.traces.analysis import sequences as S

    reads, notes, unreadable = [], [], []
    for path in ring_files.in_folder(folder):
        try:
            reads.append(ring_files.read(path))
        except (files.TraceError, ValueError) as exc:
            unreadable.append(f"{path}: cannot be read ({_without_path(exc, path)})")
    if not reads:
        return Verdict([], {}, None, notes, unreadable or [
            f"{folder}: no ring files (*{ring.SUFFIX}) yet"])
    newest = max(reads, key=lambda r: r.meta.get("wall_ns", 0)).meta.get("run")
    others = sorted({str(r.meta.get("run")) for r in reads if r.meta.get("run") != newest})
    if others:
        notes.append(f"rings of other runs left out ({', '.join(others)}): read run {newest}")
    reads = [r for r in reads if r.meta.get("run") == newest and r.rank is not None]
    members: S.Members = {}
    by_seq: dict[str, dict[int, dict[int, S.Step]]] = {}
    for one in reads:
        _last_steps(one, by_seq, members)
    lines = S.hang_of({}, members, by_seq)
    if not lines:
        from autoannot.traces.analysis import gpu_hang

        lines = gpu_hang.lines_of(reads, gpu_after_s)
    return Verdict(lines, {r.rank: r.count for r in reads}, newest, notes, unreadable)


def _without_path(exc: Exception, path: Path) -> str:
    """An error's words without the path they begin with (said before them already)."""
    text = str(exc)
    return text.removeprefix(f"{path}: ")


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


#: The launches of each ring read to look for stragglers (the tail: 48 bytes each).
TAIL = 1024


def tails_of_rings(folder: Path, tail: int = TAIL) -> Any:
    """The last ``tail`` launches of each ring of ``folder`` (its newest run), as the
    straggler windows read them (``progress.Tails``); None where no ring can be read. A group
    whose every rank has the GPU's times of its last launches is read from them (when each
    GPU started, and its time outside collectives from the GPU's end before: ``Tails.gpu``);
    else from the hosts' entries."""
    reads = []
    for path in ring_files.in_folder(folder):
        try:
            reads.append(ring_files.read(path, tail))
        except (files.TraceError, ValueError):
            continue
    if not reads:
        return None
    newest = max(reads, key=lambda r: r.meta.get("wall_ns", 0)).meta.get("run")
    tails = progress.Tails({}, {}, {}, {}, {}, {}, set())
    on_gpu: dict[str, dict[int, tuple[dict[int, float], dict[int, float]]]] = {}
    for one in reads:
        if one.meta.get("run") != newest or one.rank is None:
            continue
        _tail_of_ring(one, tails, on_gpu)
    for group, ranks in on_gpu.items():  # (the GPU's times where every rank has them)
        everyone = tails.entered.get(group, {})
        if set(ranks) != set(everyone):
            continue
        timed = set.intersection(*(set(starts) for starts, _ in ranks.values()))
        for rank, (starts, outside) in ranks.items():
            for seq in timed:
                tails.entered[group][rank][seq] = starts[seq]
                tails.gaps[group][rank][seq] = outside[seq]
        if timed:
            tails.gpu.add(group)
    return tails


def _tail_of_ring(one: ring_files.RingRead, tails: Any,
                  on_gpu: dict[str, dict[int, tuple[dict[int, float], dict[int, float]]]]
                  ) -> None:
    """One ring's part of ``tails``; the GPU starts and times outside of its launches timed on
    the GPU into ``on_gpu`` (group -> rank -> by seq)."""
    from autoannot.traces.read.rank_files import group_ranks

    entered, gaps, members, sites, clocks, labels, _ = tails
    clocks[one.rank] = one.meta.get("host")
    records = one.records
    at_us = records["entered_ns"] / 1e3
    outside_us = _outside_us(records["entered_ns"], records["returned_ns"])
    gpu = one.gpu
    if gpu is not None:
        gpu_at_us = gpu["start_ns"] / 1e3
        gpu_outside_us = _outside_us(gpu["start_ns"], gpu["end_ns"])
    for k, kind in one.kinds.items():
        annotation = kind.get("annotation") or {}
        group = kind["group"]
        if group not in members and (ranks := group_ranks(annotation)) is not None:
            members[group] = ranks
            desc = annotation.get("Process Group Description")
            labels[group] = (names.group_label(group, desc, ranks),
                             names.group_desc(desc, ranks))
        mine = records["kind"] == k
        if not mine.any():
            continue
        seqs = records["seq"][mine].tolist()
        entered.setdefault(group, {}).setdefault(one.rank, {}).update(
            zip(seqs, at_us[mine].tolist(), strict=True))
        gaps.setdefault(group, {}).setdefault(one.rank, {}).update(
            zip(seqs, outside_us[mine].tolist(), strict=True))
        if gpu is not None and (timed := mine & (gpu["start_ns"] > 0)).any():
            starts, outside = on_gpu.setdefault(group, {}).setdefault(one.rank, ({}, {}))
            timed_seqs = records["seq"][timed].tolist()
            starts.update(zip(timed_seqs, gpu_at_us[timed].tolist(), strict=True))
            outside.update(zip(timed_seqs, gpu_outside_us[timed].tolist(), strict=True))
        site = one.sites.get(int(records["site"][mine][-1]))
        if site:
            sites[(group, one.rank)] = site


def _outside_us(began_ns: Any, ended_ns: Any) -> Any:
    """Each launch's time outside collectives before it (us): its start less the end of the
    launch before; NaN where either is unknown (an end 0: running, raised, or untimed; a
    replay's launches, entered as one)."""
    import numpy as np

    ended = ended_ns.astype(float)
    ended[ended <= 0] = np.nan
    outside = np.full(len(began_ns), np.nan)
    outside[1:] = (began_ns[1:] - ended[:-1]) / 1e3
    outside[outside < 0] = np.nan
    return outside


def once(source: Any) -> tuple[int, list[str], Verdict]:
    """One look (``autoannot watch --once``): its exit code (2: nothing, or not everything,
    could be read; 1: a hang; 0: none), what it says, and the verdict (its notes and what
    could not be read: for stderr). No all-clear is given about a rank whose ring or progress
    could not be read."""
    source.counts()
    found = source.verdict()
    what = "progress" if isinstance(source, StoreProgress) else "rings"
    read = f"{len(found.counts)} ranks' {what}"
    if found.lines:
        said = list(found.lines)
    elif not found.counts:
        said = []
    elif found.unreadable:
        from autoannot.traces.analysis.matching import rank_list

        said = [f"no hang among the {what} read ({rank_list(sorted(found.counts))}'s): none "
                f"of them waits on another; {len(found.unreadable)} could not be read, and "
                "nothing is said of their ranks"]
    else:
        said = [f"no hang: {read}, no rank waits on another"]
    code = 2 if found.unreadable or not found.counts else 1 if found.lines else 0
    return code, said, found


def store_source(address: tuple[str, int]) -> StoreProgress:
    """The progress the ranks publish to the store at ``address`` (raises what torch raises
    where none answers)."""
    from autoannot.live.publish import connect

    return StoreProgress(connect(address), f"{address[0]}:{address[1]}")


def served_metrics(port: int, say: Callable[[str], None]) -> Any:
    """The job's metrics served for Prometheus on ``port`` (``live.metrics``), said; raises
    ImportError (no prometheus-client) or OSError (the port)."""
    from autoannot.live.metrics import JobMetrics

    metrics = JobMetrics(say)
    metrics.serve(port)
    say(f"autoannot watch: Prometheus metrics on port {port} (/metrics)")
    return metrics


def newest_run(interval: float, say: Callable[[str], None], attached: bool) -> Path | None:
    """The newest run's folder of rings (``base.run_folders``: a job that asked for the watch
    without ``AUTOANNOT_RING``); where there is none, None, or (``attached``) once one appears,
    said to be looked for."""
    from autoannot.base import run_folders

    found = run_folders.newest()
    if found is None and attached:
        say(f"autoannot watch: no run's rings under {run_folders.root()} yet: still looking")
        while found is None:
            time.sleep(interval)
            found = run_folders.newest()
    return None if found is None else Path(found)


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

    def __init__(self, folder: Path, gpu_after_s: float = GPU_AFTER_S) -> None:
        self.folder = folder
        self.gpu_after_s = gpu_after_s  # (a GPU hang: its launch entered this long ago)
        self._unreadable: dict[Path, str] = {}
        self._empty = False

    def __str__(self) -> str:
        return f"their rings in {self.folder}"

    def counts(self) -> dict[Any, int]:
        found, self._unreadable = counts_of(self.folder)
        self._empty = not found and not self._unreadable
        return found

    def notes(self) -> list[str]:
        """What the last look could not read: no ring yet, or rings it cannot read."""
        if self._empty:
            return [f"no ring in {self.folder} yet (*{ring.SUFFIX}): still looking"]
        return [f"{path}: cannot be read ({why}): still looking"
                for path, why in sorted(self._unreadable.items())]

    def verdict(self) -> Verdict:
        return verdict(self.folder, self.gpu_after_s)

    def tails(self) -> Any:
        return tails_of_rings(self.folder)

    def update_metrics(self, metrics: Any) -> None:
        metrics.update(self.folder)


class StoreProgress:
    """What a watcher reads: the progress the ranks publish to a c10d store
    (``live.publish``); ``store``: a client of it. At every look each rank's launch count (a
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
        self._unmetered: list[dict[str, Any]] | None = None  # documents read, not yet metered

    def __str__(self) -> str:
        return f"the store at {self.label}"

    def notes(self) -> list[str]:
        return [] if self._ranks else [f"no rank has published to {self} yet: still looking"]

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

        if not self._ranks:
            return []
        values = self.store.multi_get([ring.progress_key(r) for r in range(self._ranks)])
        documents = [d for d in map(progress.decode, values) if d is not None]
        documents = [d for d in documents if self._run is None or d.get("run") == self._run]
        self._unmetered = documents  # (the metrics' next update)
        return documents

    def verdict(self) -> Verdict:
        from autoannot.traces.analysis import sequences as S

        documents = self._documents()
        members, by_seq, counts = steps_of_documents(documents)
        lines = S.hang_of({}, members, by_seq)
        culprit = culprit_of(lines)
        stale = None if culprit is None else progress.stale_culprit(documents, culprit)
        return Verdict(lines + ([stale] if stale else []), counts, self._run, [],
                       [] if documents else [f"{self}: no rank has published"])

    def tails(self) -> Any:
        """The ranks' last launches from their documents, read again no more than a quarter
        of the time (None between)."""

        began = self.clock()
        if began < self._next_straggler_look:
            return None
        tails = progress.tails_of(self._documents())
        self._next_straggler_look = began + 4 * (self.clock() - began)
        return tails

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

    members: S.Members = {}
    by_seq: dict[str, dict[int, dict[int, S.Step]]] = {}
    counts = {}
    for document in documents:
        rank = int(document["rank"])
        counts[rank] = int(document["count"])
        for group, held in document["groups"].items():
            size = held.get("size")
            if isinstance(size, int):
                known = members.get(group, (size, None, ""))
                members[group] = (max(size, known[0]), known[1] or progress.members_of(held),
                                  known[2] or str(held.get("desc") or ""))
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
        self.source = RingsFolder(folder, stall) if isinstance(folder, Path) else folder
        self.metrics = metrics  # (``live.metrics.JobMetrics``, updated at each look)
        self.stall = stall
        self.say = say
        self.clock = clock
        self._counts: dict[Path, int] = {}
        self._since = clock()  # when the counts last changed
        self._said: list[str] | None = None  # the hang said, until the job moves
        self.stragglers = stragglers.Tracker()  # (named: while they stand out)
        self._noted: dict[str, bool] = {}  # what could not be read: said (True) or seen once

    def look(self) -> list[str] | None:
        """One look: the hang's lines where one is said now (None otherwise)."""
        now = self.clock()
        counts = self.source.counts()
        self._note(self.source.notes())
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

    def _note(self, notes: list[str]) -> None:
        """Say what cannot be read, once, where two looks in a row saw it (a ring being made
        as it is looked at is not said)."""
        seen = {note: self._noted.get(note) is not None for note in notes}
        for note, twice in seen.items():
            if twice and not self._noted[note]:
                self.say(f"autoannot watch: {note}")
        self._noted = {note: twice for note, twice in seen.items()}

    def _look_for_stragglers(self) -> None:
        """Read the windows the job completed since the last look: say each rank named a
        straggler now (once), and each that no longer stands out (``stragglers.Tracker``)."""
        tails = self.source.tails()
        if tails is None:
            return
        named, ended = self.stragglers.update(
            tails.entered, tails.members, tails.gaps, tails.clocks, tails.sites, tails.labels,
            tails.gpu)
        for straggler in named:
            self.say(f"autoannot watch: {straggler.line()}")
        for line in ended:
            self.say(f"autoannot watch: {line}")
        if self.metrics is not None:
            self.metrics.stragglers(self.stragglers.named)

    def run(self, interval: float, stop: Any = None) -> None:
        """Look every ``interval`` seconds until ``stop`` (a ``threading.Event``) is set."""
        while stop is None or not stop.is_set():
            self.look()
            if stop is None:
                time.sleep(interval)
            else:
                stop.wait(interval)

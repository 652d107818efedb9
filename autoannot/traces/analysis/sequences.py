"""``autoannot check``: do the ranks launch the same collectives in the same order?

A graph captured with a different collective sequence on one rank (another size or dtype, or
an extra collective behind a rank-dependent branch) deadlocks or corrupts at replay, silently;
so does an eager run that diverges. Each rank's sequences are read from its ledgers (per
captured graph, per process group), its record file (per process group) or its trace (eager
NCCL kernels with collective args, per process group), and compared across the ranks that
have each: the first place where they differ is reported per (scope, group), with each rank's
collective, sizes, dtype and call site.

The same comparison runs inside a job (``AUTOANNOT_VERIFY=1``: the runtime's ``live.verify``
asks ``first_divergence``): at the end of each capture, every rank posts its graph's sequence to
the c10d store and compares it with the others' before the first replay can hang.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoannot.describe import vocabulary as V
from autoannot.traces import files, names

#: What must agree across ranks, from an annotation.
FIELDS = V.SEQUENCE_FIELDS


@dataclass(frozen=True)
class Step:
    """One collective of a rank's sequence."""

    what: tuple[Any, ...]  # FIELDS' values
    call_site: str | None
    at_ns: int | None = field(default=None, compare=False)  # entry (wall clock), where known

    @property
    def key(self) -> tuple[Any, ...]:
        """What must agree across ranks: a send on one rank meets a recv on its peer."""
        name = self.what[0]
        return ("send/recv", *self.what[1:]) if name in ("send", "recv") else self.what

    def describe(self) -> str:
        if len(self.what) == 1:  # a gap: what the rank has nothing of
            text = str(self.what[0])
        elif len(self.what) == 2:  # from a trace: collective, bytes
            text = f"{self.what[0]} {self.what[1]} B"
        else:
            name, inn, out, dtype = self.what[:4]
            text = f"{name} {inn}->{out} elements, {dtype}"
        return text + (f", at {self.call_site}" if self.call_site else "")


def step_of(annotation: dict[str, Any], call_site: str | None = None,
            at_ns: int | None = None) -> Step:
    return Step(tuple(annotation.get(k) for k in FIELDS), call_site, at_ns)


#: (scope, group) -> rank -> its steps. scope: "eager", or a captured graph's name.
Sequences = dict[tuple[str, str], dict[int, list[Step]]]

#: group -> (its size, its member ranks where an input names them all, its description).
Members = dict[str, tuple[int, tuple[int, ...] | None, str]]


def note_members(members: Members, group: str, annotation: dict[str, Any]) -> None:
    """What an annotation says of its group: its size; its ranks where torch lists all; its
    description."""
    from autoannot.traces.read.rank_files import group_ranks

    size = annotation.get(V.GROUP_SIZE)
    if not isinstance(size, int):
        return
    known = members.get(group, (size, None, ""))
    desc = str(annotation.get(V.PG_DESC) or "")
    members[group] = (max(size, known[0]), known[1] or group_ranks(annotation),
                      known[2] if desc in names.NO_DESCRIPTION else desc)


def missing_ranks(sequences: Sequences, members: Members) -> list[str]:
    """Per group whose members did not all leave a record of it: who is missing (a dead or
    stuck rank leaves nothing: never an all-clear without it)."""
    from autoannot.traces.analysis.matching import rank_list

    held: dict[str, set[int]] = defaultdict(set)
    for (_, group), per_rank in sequences.items():
        held[group] |= set(per_rank)
    found = []
    for group, (size, ranks, desc) in sorted(members.items()):
        present = held.get(group, set())
        label = names.group_label(group, desc, ranks)
        if ranks is not None:
            absent = sorted(set(ranks) - present)
            if absent:
                found.append(f"group {label}: {rank_list(absent)} of its {size} ranks left no "
                             f"record (here: {rank_list(sorted(present))})")
        elif len(present) < size:
            found.append(f"group {label}: {size - len(present)} of its {size} ranks left no "
                         f"record (here: {rank_list(sorted(present))}; the inputs do not name "
                         "the group's ranks)")
    return found


def from_ledger(path: Path, sequences: Sequences, members: Members | None = None) -> int:
    from autoannot.traces.read import ledger

    document = ledger.load(path)
    rank = document.get("rank")
    if not isinstance(rank, int):
        raise files.TraceError(f"{path}: the ledger names no rank")
    for graph, entries in (document.get("graphs") or {}).items():
        per_group: dict[str, list[Step]] = defaultdict(list)
        for entry in entries:
            annotation = entry.get("annotation") or {}
            if V.COLLECTIVE_NAME in annotation:
                group = str(annotation.get(V.PG_NAME, "?"))
                per_group[group].append(step_of(annotation, entry.get("call_site")))
                if members is not None:
                    note_members(members, group, annotation)
        for group, steps in per_group.items():
            sequences[(graph, group)][rank] = steps
    return rank


def from_records(path: Path, sequences: Sequences, members: Members | None = None,
                 run: str | None = None) -> set[int]:
    """A record file's eager sequences, per rank (a file several ranks wrote holds several:
    ``RecordFile.by_rank``), run of the job and group (runs never compared with each other);
    the ranks it holds."""
    from autoannot.traces.read import record_files
    from autoannot.traces.read.runs import NO_RUN, run_of

    ranks: set[int] = set()
    for record in record_files.read(path).by_rank():
        rank = record.rank
        per_group: dict[tuple[str, str], list[Step]] = defaultdict(list)
        for entry in record.lines:
            annotation = entry["annotation"]
            if record_files.is_collective(entry) and (run is None or run_of(entry) == run):
                group = str(entry.get("group", annotation.get(V.PG_NAME, "?")))
                at = entry.get("wall_ns")
                per_group[(run_of(entry), group)].append(step_of(
                    annotation, entry.get("call_site"), at if isinstance(at, int) else None))
                if members is not None:
                    note_members(members, group, annotation)
        if rank is None:
            raise files.TraceError(f"{path}: names no rank")
        for (one_run, group), steps in per_group.items():
            scope = "eager" if one_run == NO_RUN else f"eager, run {one_run}"
            if rank in sequences[(scope, group)]:
                raise files.TraceError(f"{path}: rank {rank}'s record is given twice (in this "
                                       "file and another)")
            sequences[(scope, group)][rank] = steps
        ranks.add(rank)
    return ranks


#: Rows' scope: each rank's steps keyed by their sequence number (``from_rows``); the ranks'
#: profiled windows differ, so only the stretch all of a group's ranks hold is compared.
ROWS_SCOPE = "eager (rows)"


def from_rows(path: Path, by_seq: dict[str, dict[int, dict[int, Step]]],
              members: Members | None = None) -> int:
    """A rows file's steps per group, by sequence number (compared as traces are:
    collective and bytes)."""
    from autoannot.traces.table import rows

    return steps_of_rows(rows.read(path), by_seq, members)


def steps_of_rows(one: Any, by_seq: dict[str, dict[int, dict[int, Step]]],
                  members: Members | None = None) -> int:
    """``from_rows`` of rows read (``rows.Rows``: a rows file's, or a Flight Recorder
    dump's)."""
    c = one.columns
    for g in one.groups if members is not None else ():
        ranks = g.get("ranks")
        annotation = {V.GROUP_SIZE: int(g.get("size", 1)),
                      V.PG_RANKS: str(ranks) if isinstance(ranks, list) else None,
                      V.PG_DESC: str(g.get("desc", ""))}
        note_members(members, str(g["name"]), annotation)
    for i in range(len(one)):
        group = str(one.groups[c["group"][i]]["name"])
        site = one.sites[c["site"][i]] if c["site"][i] >= 0 else None
        start = float(c["start_us"][i])  # (one rank's own base: its launches in order)
        by_seq.setdefault(group, {}).setdefault(one.rank, {})[c["seq"][i]] = Step(
            (one.collectives[c["collective"][i]], c["size_bytes"][i]), site,
            None if start != start else int(start * 1e3))
    return one.rank


def _rows_windows(by_seq: dict[str, dict[int, dict[int, Step]]], sequences: Sequences) -> None:
    """Each group's steps over the sequence numbers every rank's rows cover."""
    for group, per_rank in by_seq.items():
        low = max(min(steps) for steps in per_rank.values())
        high = min(max(steps) for steps in per_rank.values())
        for rank, steps in per_rank.items():
            gap = Step(("nothing at this place in its rows",), None)
            sequences[(ROWS_SCOPE, group)][rank] = [steps.get(seq, gap)
                                                     for seq in range(low, high + 1)]


def from_trace(path: Path, position: int, sequences: Sequences,
               members: Members | None = None,
               gloo_only: list[tuple[Path, int]] | None = None) -> int:
    """A trace's eager NCCL collectives, per group (compared with other traces only: a trace
    gives sizes in bytes, not the annotation's fields)."""
    from autoannot.traces.read import rank_files

    rank, launches, gloo = rank_files.trace_launches(path)
    rank = position if rank is None else rank
    if gloo and not launches and gloo_only is not None:  # (said where nothing else is given)
        gloo_only.append((path, len(gloo)))
    per_group: dict[str, list[Step]] = defaultdict(list)
    for launch in launches:
        per_group[launch.group].append(Step((launch.collective, launch.size_bytes), None))
        if members is not None:
            note_members(members, launch.group, {
                V.GROUP_SIZE: launch.group_size, V.PG_DESC: launch.group_desc,
                V.PG_RANKS: None if launch.group_ranks is None else str(list(launch.group_ranks))})
    for group, steps in per_group.items():
        sequences[("eager (traces)", group)][rank] = steps
    return rank


@dataclass
class Divergence:
    scope: str
    group: str
    position: int
    ranks: dict[int, str]  # rank -> what it launched there ("nothing": its sequence ended)
    label: str = ""  # the group as said (``names.group_label``; "": its name alone)

    def describe(self) -> str:
        where = self.scope if self.scope.startswith("eager") else f"graph {self.scope}"
        parts = "; ".join(f"rank {r}: {what}" for r, what in sorted(self.ranks.items()))
        return f"{where}, group {self.label or self.group}, collective #{self.position}: {parts}"

    def as_dict(self) -> dict[str, Any]:
        return {"scope": self.scope, "group": self.group, "position": self.position,
                "ranks": {str(r): what for r, what in sorted(self.ranks.items())}}


def compare(sequences: Sequences) -> tuple[list[Divergence], int]:
    """The first divergence of each (scope, group) its ranks disagree on; and how many
    (scope, group) sequences were compared (held by 2 ranks or more)."""
    found, compared = [], 0
    for (scope, group), per_rank in sorted(sequences.items()):
        if len(per_rank) < 2:
            continue
        compared += 1
        length = max(len(steps) for steps in per_rank.values())
        for position in range(length):
            here = {rank: steps[position] if position < len(steps) else None
                    for rank, steps in per_rank.items()}
            if len({step.key if step else None for step in here.values()}) > 1:
                found.append(Divergence(scope, group, position, {
                    rank: step.describe() if step else "nothing (its sequence ended)"
                    for rank, step in here.items()}))
                break
    return found, compared


def check_files(paths: list[Path], run: str | None = None, missing: list[str] | None = None,
                hang_lead: list[str] | None = None) -> tuple[list[Divergence], int, int]:
    """Read ledgers (``*.autoannot``), record files (``*.jsonl``: one run of the job, ``run``
    or the only one), rows (``*.rows``) and traces; compare.
    Returns the divergences, the sequences compared and the ranks read; the groups' missing
    ranks go into ``missing``; a hang's culprit and blocked ranks (``hang``) into
    ``hang_lead``, and then a rank's sequence that only ends early is no divergence."""
    from autoannot.traces.read import flight_recorder, ledger, record_files, ring_files, runs
    from autoannot.traces.table import rows

    rings = [p for p in paths if ring_files.is_ring(p)]
    dumps = [p for p in paths if not rows.is_rows_name(p) and p.suffix != ".jsonl"
             and not p.name.endswith((ledger.SUFFIX, ledger.LEGACY_SUFFIX))
             and p not in rings and flight_recorder.is_dump(p)]
    paths = [p for p in paths if p not in dumps and p not in rings]
    ringed = ring_files.rows_of(rings)
    rows_files = [p for p in paths if rows.is_rows_name(p)]
    found = record_files.runs_in([p for p in paths if p.suffix == ".jsonl"], rows_files)
    for path, one in zip(rings, ringed, strict=True):
        found.setdefault(one.run or runs.NO_RUN, []).append(path)
    run_of_rows = {p: rows.read_head(p)[0].run or runs.NO_RUN for p in rows_files}
    if found:
        run = runs.choose(found, run)
    elif run is not None:
        raise files.TraceError(f"--run {run}: only record files (*.jsonl) and rows name runs, "
                               "and none is given")
    members: Members = {}
    sequences: Sequences = defaultdict(dict)
    ranks: set[int] = set()
    traces = 0
    given = {os.path.realpath(p) for p in paths}
    rows_by_seq: dict[str, dict[int, dict[int, Step]]] = {}
    gloo_only: list[tuple[Path, int]] = []
    for path in paths:
        if path.name.endswith((ledger.SUFFIX, ledger.LEGACY_SUFFIX)):
            ranks.add(from_ledger(path, sequences, members))
        elif path.suffix == ".jsonl":
            ranks |= from_records(path, sequences, members, run)
        elif rows.is_rows_name(path):
            if run_of_rows[path] == run:
                ranks.add(from_rows(path, rows_by_seq, members))
        else:
            ranks.add(from_trace(path, traces, sequences, members, gloo_only))
            traces += 1
            beside = ledger_of_trace(path)  # its graphs, as annotate reads them
            if beside is not None and os.path.realpath(beside) not in given:
                given.add(os.path.realpath(beside))
                from_ledger(beside, sequences)
    for one in ringed:  # (the rings: for the ranks no record file or rows hold)
        if (one.run or runs.NO_RUN) == run and one.rank not in ranks:
            ranks.add(steps_of_rows(one, rows_by_seq, members))
    if dumps:  # (torch's Flight Recorder's: for the ranks no other input holds)
        for one in flight_recorder.read(dumps):
            if one.rank not in ranks:
                ranks.add(steps_of_rows(one, rows_by_seq, members))
    _rows_windows(rows_by_seq, sequences)
    if gloo_only and not sequences:
        from autoannot.traces.read.rank_files import gloo_needs_records

        raise gloo_needs_records([p for p, _ in gloo_only], sum(n for _, n in gloo_only))
    divergences, compared = compare(sequences)
    for divergence in divergences:
        size_ranks_desc = members.get(divergence.group)
        if size_ranks_desc is not None:
            divergence.label = names.group_label(divergence.group, size_ranks_desc[2],
                                                 size_ranks_desc[1])
    if missing is not None:
        missing += missing_ranks(sequences, members)
    if hang_lead is not None:
        hang_lead += hang_of(sequences, members, rows_by_seq)
        if not hang_lead and rings:  # (the hosts show none: a GPU that never started one)
            from autoannot.traces.analysis import gpu_hang

            reads = [ring_files.read(p) for p in rings]
            hang_lead += gpu_hang.lines_of([r for r in reads if (r.meta.get("run") or
                                                                  runs.NO_RUN) == run],
                                           gpu_hang.OFFLINE_AFTER_S, live=False)
        if hang_lead:  # (an absence the hang explains: not a divergence)
            divergences = [d for d in divergences if not _ends_only(d)]
    return divergences, compared, len(ranks)


def _ends_only(divergence: Divergence) -> bool:
    """Whether the ranks differ there only in that some ranks' sequences ended."""
    launched = {what for what in divergence.ranks.values() if not what.startswith("nothing")}
    return len(launched) <= 1


def hang_of(sequences: Sequences, members: Members,
            rows_by_seq: dict[str, dict[int, dict[int, Step]]] | None = None) -> list[str]:
    """The lead of a hang (``hang.wait_for``) from the ranks' eager sequences (each one's
    last launch on each group: its position in the group's sequence; in rows, its seq),
    empty where none."""
    from autoannot.traces.analysis import hang
    from autoannot.traces.analysis.matching import rank_list

    groups = []
    steps_of: dict[str, dict[int, Any]] = {}  # group -> rank -> its steps (by position or seq)
    for (scope, group), per_rank in sorted(sequences.items()):
        if not scope.startswith("eager") or scope == ROWS_SCOPE or group in steps_of:
            continue
        steps_of[group] = dict(per_rank)
    for group, per_rank in sorted((rows_by_seq or {}).items()):
        steps_of.setdefault(group, {}).update(per_rank)
    for group, per_rank in sorted(steps_of.items()):
        size, named, desc = members.get(group, (len(per_rank), None, ""))
        groups.append(hang.GroupProgress(
            group, desc, size, named, {r: (max(steps) if isinstance(steps, dict) else
                                         len(steps) - 1) for r, steps in per_rank.items()
                                     if steps}))
    found = hang.wait_for(groups)
    if found is None:
        return []

    def describe(group: str, seq: int, rank: int) -> hang.Launch | None:
        def at(steps: Any) -> Step | None:
            if isinstance(steps, dict):
                return steps.get(seq)
            return steps[seq] if seq < len(steps) else None

        per_rank = steps_of[group]
        step = at(per_rank.get(rank, [])) or next(
            (found for s in per_rank.values() if (found := at(s)) is not None), None)
        if step is None:
            return None
        return hang.Launch(str(step.what[0]), step.call_site, -1,
                           None if step.at_ns is None else step.at_ns / 1e3)

    return hang.lines(found, groups, describe, rank_list)


def ledger_of_trace(path: Path) -> Path | None:
    """The ledger of a trace: beside it, or (an annotated output) the one it was annotated
    from, where it still is."""
    from autoannot.traces.read import ledger

    found = ledger.find(path)
    if found is not None:
        return found
    marker = files.annotated_from(path)
    named = marker.get("ledger") if marker else None
    return Path(named) if isinstance(named, str) and Path(named).is_file() else None


# --- in the job ----------------------------------------------------------------------------------

#: A rank's launches as a job posts them: (group, annotation, call site) each.
Posted = list[tuple[str, dict[str, Any], str | None]]


def first_divergence(scope: str, by_rank: dict[int, Posted]) -> str | None:
    """Where the ranks' launches of one scope (a captured graph) first differ, per group, in
    ``check``'s words; None where they agree (``AUTOANNOT_VERIFY``: the job asks)."""
    sequences: Sequences = defaultdict(dict)
    for rank, launches in sorted(by_rank.items()):
        per_group: dict[str, list[Step]] = defaultdict(list)
        for group, annotation, site in launches:
            per_group[str(group)].append(step_of(annotation, site))
        for group, steps in per_group.items():
            sequences[(scope, group)][rank] = steps
    divergences, _ = compare(sequences)
    return divergences[0].describe() if divergences else None

"""The analysis of a job's files: every rank's trace, record file and rows read
(``rank_files``), put on one clock, and matched (``matching``).

Per instance: each rank's arrival (its kernel's start), the straggler (the last to arrive),
the skew (last arrival - first), each rank's wait and the transfer (the straggler's own
kernel time: from the last arrival to the end, as nccl-tests time a collective after a
barrier); see ``matching`` for the model. Each rank's trace is read on its own process
(``-j``); rows alone are read one file at a time into the matcher's arrays.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from autoannot.traces import files
from autoannot.traces.analysis.matching import Analysis, rank_list
from autoannot.traces.read import ring_files
from autoannot.traces.read.rank_files import (
    gloo_needs_records,
    join,
    read_rows_files,
    record_launches,
    trace_launches,
)
from autoannot.traces.table.launch import Launch
from autoannot.traces.table.rows import is_rows_name


def analyze_files(traces: Iterable[Path], records: Iterable[Path], jobs: int | None = None,
                  progress: bool = False, run: str | None = None,
                  rows: Iterable[Path] = (), include_warmup: bool = False,
                  engine: Any = None, target: int | None = None) -> Analysis:
    """Read every trace (on ``jobs`` processes), record file and rows file (``table.rows``),
    join them per rank, and match instances. Record files holding several runs of a job:
    ``run`` names the one to line up (TraceError naming them all where it is None). A rank's
    rows stand for its trace and record file (they were made from them). Rows alone are
    matched in whole-array steps (``matching``: thousands of ranks), in partitions of about
    ``target`` launches run by ``engine`` (``engines``; default: this machine's ``jobs``
    processes)."""
    from autoannot.traces import parallel

    traces, records, rows = list(traces), list(records), list(rows)
    rings = [p for p in rows if ring_files.is_ring(p)]  # (AUTOANNOT_RING's)
    dumps = [p for p in rows if not is_rows_name(Path(p)) and p not in rings]  # (torch's
    rows = [p for p in rows if is_rows_name(Path(p))]  # Flight Recorder's)
    cut_notes: list[str] = []
    read_records = [(path, *part) for path in records
                    for part in record_launches(path, cut_notes)]
    found: dict[str, list[Path]] = {}
    for path, _, by_run, _ in read_records:
        for name in by_run:
            found.setdefault(name, []).append(path)
    ringed = ring_files.rows_of(rings)
    for path, one in zip(rings, ringed, strict=True):
        found.setdefault(one.run or "", []).append(path)
    # one run of the job, of the rows, the record files and the rings together (runs.choose)
    rows_of, chosen = read_rows_files(rows, run, heads_only=not traces and not records,
                                      others=found)
    if ringed:
        _add_rings(ringed, rows_of, {rank for _, rank, _, _ in read_records}, chosen)
    if dumps:
        cut_notes += _add_dumps(dumps, rows_of, {rank for _, rank, _, _ in read_records},
                                bool(traces))
    if not traces and not records and rows_of:
        from autoannot.traces.analysis import engines, matching

        return matching.analyze_rows(list(rows_of.values()), include_warmup,
                                     engine or engines.Embedded(jobs, progress), target)
    problems: list[str] = []
    traced: dict[int, tuple[list[Launch], list[tuple[str, float, float]], Path]] = {}
    read = parallel.map_files(trace_launches, traces, jobs, "read", show=progress)
    for position, (path, (rank, launches, gloo)) in enumerate(zip(traces, read, strict=True)):
        rank = position if rank is None else rank
        if rank in traced:
            raise files.TraceError(f"{traced[rank][2]} and {path} are both rank {rank}'s "
                                   "trace: give one trace per rank of one job")
        traced[rank] = (launches, gloo, path)
    recorded: dict[int, tuple[list[Launch], Path]] = {}
    hosts: dict[int, str | None] = {}
    for path, rank, by_run, host in read_records:
        if chosen not in by_run:
            continue  # (a record of another run: --run picked this one)
        launches = by_run[chosen]
        if rank is None:
            raise files.TraceError(f"{path}: names no rank (written before the process group "
                                   "was up, with no RANK set): cannot place it")
        if rank in recorded:
            raise files.TraceError(f"{recorded[rank][1]} and {path} are both rank {rank}'s "
                                   "record file")
        recorded[rank] = (launches, path)
        hosts[rank] = host
    per_rank: dict[int, list[Launch]] = {}
    from autoannot.traces.table.rows import to_launches

    notes = []
    origins: dict[int, str] = {}  # each rank's input, for messages
    for rank, one in rows_of.items():
        per_rank[rank] = to_launches(one)
        origins[rank] = str(one.path or one.source)
        given = [str(p) for p in (traced.pop(rank, (None, None, None))[2],
                                  recorded.pop(rank, (None, None))[1]) if p is not None]
        if given:
            notes.append(f"rank {rank}: its rows ({one.source or 'rows file'}) stand for "
                         f"{' and '.join(given)}")
    for rank in sorted(set(traced) | set(recorded)):
        launches, gloo, path = traced.get(rank, ([], [], None))
        records, record_path = recorded.get(rank, ([], None))
        where = origins[rank] = str(path or record_path)
        per_rank[rank] = join(rank, launches, gloo, records, problems, where)
        if not per_rank[rank]:
            problems.append(f"{where}: no collective to line up (eager NCCL kernels with "
                            "collective args, annotated graphed ones, or a record file)")
    if traced and not any(per_rank.values()):
        gloo_ranges = sum(len(gloo) for _, gloo, _ in traced.values())
        if gloo_ranges:
            raise gloo_needs_records([p for _, _, p in traced.values()], gloo_ranges)
    bases: dict[int, tuple[str, float | None]] = {}  # rank -> (what times it, its epoch)
    for rank in per_rank:
        if rank in rows_of:
            one = rows_of[rank]
            bases[rank] = ("rows", one.base_ns if one.clock == "trace" else 0)
        elif rank in traced:
            bases[rank] = ("trace", None)
        else:
            launches = per_rank[rank]
            wall = bool(launches) and all(launch.wall_us is not None for launch in launches)
            bases[rank] = ("record file", 0 if wall else None)
    _one_time_base(per_rank, bases, {rank: traced[rank][2] for rank in traced})
    analysis = matching_rows(per_rank, include_warmup, engine, target, origins)
    analysis.problems[:0] = problems
    analysis.notes[:0] = notes + cut_notes
    timed_by_entry = {hosts[rank] for rank in recorded if rank not in traced}
    if len(timed_by_entry) > 1:
        analysis.notes.append(
            f"the ranks timed by their record files alone ran on {len(timed_by_entry)} hosts: "
            "their entry times are on each host's wall clock, which agree only as well as the "
            "hosts are synchronised (NTP: often within a millisecond) — across hosts, skews "
            "and waits below that are not known")
    return analysis


def matching_rows(per_rank: dict[int, list[Launch]], include_warmup: bool, engine: Any,
                  target: int | None, origins: dict[int, str] | None = None) -> Analysis:
    """Launches read from traces and record files (each rank's named by ``origins``),
    matched (in this process unless asked)."""
    from autoannot.traces.analysis.matching import analyze_rows
    from autoannot.traces.table.rows import from_launches

    origins = origins or {}
    return analyze_rows([from_launches(launches, rank, source=origins.get(rank, ""))
                         for rank, launches in per_rank.items()],
                        include_warmup, engine, target)


def _one_time_base(per_rank: dict[int, list[Launch]],
                   bases: dict[int, tuple[str, float | None]], paths: dict[int, Path]) -> None:
    """Put ranks timed by different kinds of input on one clock: a trace's times count from its
    ``baseTimeNanoseconds``, a record file's (on the wall clock) from the epoch. Ranks of one
    kind are left as they are (one job's traces share Kineto's base). TraceError where they
    differ and one has no known epoch."""
    if len({kind for kind, _ in bases.values()}) < 2:
        return
    for rank, (kind, _) in bases.items():
        if kind == "trace":
            base = files.Trace(paths[rank]).metadata().get("baseTimeNanoseconds")
            bases[rank] = (kind, base if isinstance(base, int | float) else None)
    unknown = sorted(rank for rank, (_, base) in bases.items() if base is None)
    if unknown:
        raise files.TraceError(
            f"{rank_list(unknown)} {'is' if len(unknown) == 1 else 'are'} timed by inputs of "
            "no known epoch "
            "(a trace without baseTimeNanoseconds, or record lines without wall_ns) and the "
            "others by other kinds of input: their times cannot be lined up; give one kind "
            "of input for every rank")
    # (the latest epoch: the traces' times stay as they are, at their full precision)
    origin = max(base for _, base in bases.values())  # type: ignore[type-var]
    for rank, (_, base) in bases.items():
        shift = (base - origin) / 1e3  # type: ignore[operator]
        if shift:
            for launch in per_rank[rank]:
                launch.start_us += shift
                if launch.end_us is not None:
                    launch.end_us += shift


def _add_rings(ringed: list[Any], rows_of: dict[int, Any], recorded: set[Any],
               chosen: str | None) -> None:
    """The rings' rows (``read.ring_files``) of the chosen run into ``rows_of``, for the ranks
    no rows or record file of these inputs covers (a record file holds every launch; a ring
    the last N). Two rings of one rank refused."""
    by_rank: dict[int, Any] = {}
    for one in ringed:
        if (one.run or "") != (chosen or ""):
            continue
        if one.rank in by_rank:
            raise files.TraceError(f"{by_rank[one.rank].source} and {one.source} are both rank "
                                   f"{one.rank}'s ring: give one per rank of one job")
        by_rank[one.rank] = one
    for rank, one in by_rank.items():
        if rank not in rows_of and rank not in recorded:
            rows_of[rank] = one


def _add_dumps(dumps: list[Path], rows_of: dict[int, Any], recorded: set[Any],
               traced: bool) -> list[str]:
    """torch's Flight Recorder dumps (``read.flight_recorder``) into ``rows_of``, for the
    ranks no autoannot file of these inputs covers (autoannot's say the same and more: the
    run, every launch rather than the ring's last); what was left out, said."""
    from autoannot.traces.analysis.results import rank_list
    from autoannot.traces.read import flight_recorder

    made = flight_recorder.read(dumps)
    covered = set(rows_of) | {r for r in recorded if r is not None}
    notes = []
    left = sorted(one.rank for one in made if one.rank in covered or traced)
    for one in made:
        if one.rank not in covered and not traced:
            rows_of[one.rank] = one
    if left:
        notes.append(f"torch's Flight Recorder dumps of {rank_list(left)} left out: autoannot's "
                     "files of these inputs stand for them")
    if any(one.extra.get("never_completed") for one in made if one.rank in rows_of):
        notes.append("the Flight Recorder dumps mark no collective completed (gloo's never "
                     "do): each launch is known by its entry alone")
    return notes

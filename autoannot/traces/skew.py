"""Collective instances across ranks: who arrived last, how long the others waited, and how
long the transfer itself took.

An *instance* is one collective on every member rank of its process group: the same group,
the same position in that group's sequence. A rank's launches come from

* its trace: NCCL kernels that carry collective args (eager traces; graphed traces after
  ``autoannot annotate``), in start order per group (torch's ``Seq`` where the kernel carries
  it); gloo's profiler ranges (``gloo:all_reduce``) once a record file names them;
* its record file (``AUTOANNOT_RECORD``): group, sequence, call site and the time each launch
  was entered, for every launch of the process.

Given both for a rank, the record file gives the trace's launches their call sites and (gloo)
their groups and sizes, aligned by sequence; a rank with only a record file is timed by its
entry times (arrivals, no transfer time). Sequences that do not line up are reported, never
guessed.

Per instance: each rank's arrival (its kernel's start), the straggler (the last to arrive),
the skew (last arrival - first), each rank's wait (last arrival - its own) and the transfer
(the straggler's own kernel time: from the last arrival to the end, as nccl-tests time a
collective after a barrier). Ranks on different hosts have different clocks: a collective ends
within microseconds on all its ranks, so each rank's offset is estimated as the median of its
end times minus the first rank's, over the instances; the spread says how well that fits. The
offset is taken out only where it stands out of its own spread (more than 3 spreads and 1 us),
and reported either way. Only GPU kernels fit clocks: gloo's CPU ranges end apart, and record
files time entries by each process's monotonic clock put on the wall clock's epoch (see
``record_launches``): one clock on a host, and across hosts as close as their clocks are kept
(said in a note, never fitted away).

Scale: each rank's trace is read on its own process (``-j``); the instances' times live in two
instance x rank matrices of doubles, so a 1,024-rank job of 2,000 collectives a rank is 32 MB
of times, and rows are built one at a time where they are written.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from autoannot import vocabulary as V
from autoannot.traces import files
from autoannot.traces.launch import Launch
from autoannot.traces.matching import (  # noqa: F401  (the analysis, as the tools name it)
    IN_STEP_US,
    Analysis,
    ClockFit,
    Figures,
    Instance,
    analyze,
    describe_missing,
    rank_list,
)
from autoannot.traces.matching import count as count_of

# --- reading -----------------------------------------------------------------------------------

class GlooRange(NamedTuple):
    """One collective as gloo's profiler range shows it (``gloo:all_reduce``), on the worker
    thread of its process group that ran it."""

    name: str  # without "gloo:"
    start: float
    end: float
    wall_us: float | None  # its start on the wall clock (us since the epoch), where known
    step: int  # the profiler step it ran in; -1: none known
    thread: Any = None
    #: its input's bytes, where the profiler recorded shapes (``record_shapes=True``) and the
    #: collective's input is its one tensor; else None
    size_bytes: int | None = None


def trace_launches(path: Path) -> tuple[int | None, list[Launch], list[GlooRange]]:
    """A trace's rank, its NCCL launches with collective args, and its gloo ranges in start
    order."""
    from autoannot.traces.annotate import Scan

    trace = files.Trace(path)
    return launches_in(trace, Scan.of(trace))


def launches_in(trace: files.Trace, scan: Any, patches: Any = None
                ) -> tuple[int | None, list[Launch], list[GlooRange]]:
    """``trace_launches`` of a trace already scanned (``annotate.Scan``), its graphed kernels
    annotated by ``patches`` (``annotate.prepare``) where given: what the job holds in memory
    at export, with no second reading of the trace."""
    from autoannot.traces.units import DTYPE_BYTES

    metadata = trace.metadata()
    rank = metadata.get("distributedInfo", {}).get("rank")
    rank = rank if isinstance(rank, int) else None
    base = metadata.get("baseTimeNanoseconds")  # Kineto's: its ts count from it
    base_us = base / 1e3 if isinstance(base, int | float) and base > 0 else None
    annotations = patches.kernels if patches is not None else {}
    kernels: list[tuple[float, float, dict[str, Any]]] = []
    for index in scan.nccl:
        event = trace.event(index)
        args = annotations[index][0] if index in annotations else event.args
        if args and V.COLLECTIVE_NAME in args:
            kernels.append((event.ts, event.ts + event.dur, args))
    gloo = []
    for index in scan.gloo:
        event = trace.event(index)
        gloo.append(GlooRange(event.name[len("gloo:"):], event.ts, event.ts + event.dur,
                              None if base_us is None else base_us + event.ts, -1,
                              event.tid, _input_bytes(event.args)))
    kernels.sort(key=lambda k: k[0])
    gloo.sort(key=lambda g: g[1])
    step_of = _step_finder(scan.steps)
    members = {str(g.get("pg_name")): tuple(g["ranks"])
               for g in metadata.get("distributedInfo", {}).get("pg_config", [])
               if isinstance(g, dict) and isinstance(g.get("ranks"), list)
               and len(g["ranks"]) == g.get("pg_size")}
    counters: dict[str, int] = defaultdict(int)
    named: dict[Any, tuple[int, ...] | None] = {}  # (its ranks' text, size) -> ranks
    launches = []
    for start, end, args in kernels:
        group = str(args.get(V.PG_NAME, "?"))
        seq = args.get("Seq")
        if not isinstance(seq, int):
            seq = counters[group]
        counters[group] += 1
        nelems = max(int(args.get(V.IN_NELEMS, 0)), int(args.get(V.OUT_NELEMS, 0)))
        dtype = str(args.get(V.DTYPE, "?"))
        listed = args.get(V.PG_RANKS)
        key = (listed, args.get(V.GROUP_SIZE)) if isinstance(listed, str) else None
        ranks = named[key] if key is not None and key in named else group_ranks(args)
        if key is not None:
            named[key] = ranks
        launches.append(Launch(
            rank if rank is not None else -1, group, seq, str(args[V.COLLECTIVE_NAME]),
            nelems * DTYPE_BYTES.get(dtype, 0), int(args.get(V.GROUP_SIZE, 1)), start, end,
            group_desc=str(args.get(V.PG_DESC, "")), kernel=True, step=step_of(start),
            group_ranks=ranks or members.get(group), dtype=dtype))
    return rank, launches, [g._replace(step=step_of(g.start)) for g in gloo]


#: Bytes of an element, by the profiler's "Input type" (c10's names).
_INPUT_TYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2,
                     "long int": 8, "int": 4, "short int": 2, "signed char": 1,
                     "unsigned char": 1, "bool": 1}


def _input_bytes(args: dict[str, Any] | None) -> int | None:
    """The bytes of a gloo range's one input tensor, where the profiler recorded its shape."""
    dims, types = (args or {}).get("Input Dims"), (args or {}).get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != 1:
        return None
    shape, width = dims[0], _INPUT_TYPE_BYTES.get(types[0]) if types else None
    if width is None or not isinstance(shape, list) or not all(isinstance(d, int)
                                                                for d in shape):
        return None
    count = 1
    for d in shape:
        count *= d
    return count * width


def _step_finder(steps: list[tuple[float, float, int]]) -> Any:
    """A function of a time in the trace: the profiler step it falls in (a kernel queued in a
    step may run just after it: the last step begun before it), or -1 before the first."""
    import bisect

    steps = sorted(steps)
    begins = [s[0] for s in steps]

    def step_of(ts: float) -> int:
        at = bisect.bisect_right(begins, ts) - 1
        return steps[at][2] if at >= 0 else -1

    return step_of


def group_ranks(annotation: dict[str, Any]) -> tuple[int, ...] | None:
    """The group's member ranks from an annotation's "Process Group Ranks" (torch's text of a
    list), where it names them all (torch cuts long lists short: then None)."""
    text = annotation.get(V.PG_RANKS)
    if not isinstance(text, str) or not text.startswith("[") or not text.endswith("]"):
        return None
    try:
        ranks = tuple(int(r) for r in text[1:-1].split(",") if r.strip())
    except ValueError:
        return None
    return ranks if len(ranks) == int(annotation.get(V.GROUP_SIZE, -1)) else None


def record_launches(path: Path, notes: list[str] | None = None
                    ) -> tuple[int | None, dict[str, list[Launch]], str | None]:
    """A record file's rank, launches (entry times, call sites) per run of the job, and host
    (None where its lines do not say).

    Entry times are the process's monotonic clock (steady, but each host's own: hosts' differ
    by hours), moved onto the wall clock where the lines carry it: by the median of
    ``wall_ns - monotonic_ns`` over the run's lines, so a run keeps its steady clock and ranks
    of different hosts share an epoch (as well as the hosts' clocks agree)."""
    from autoannot.traces import record_files

    record = record_files.read(path, ("seq", "group", "monotonic_ns"),
                               "files written before autoannot 0.1 (no seq) cannot be lined up "
                               "across ranks")
    rank = record.rank
    if record.cut is not None and notes is not None:
        notes.append(f"{path}:{record.cut}: its last line was cut short (the job was killed "
                     "while writing it?): left out")
    by_run: dict[str, list[Launch]] = {}
    for run, lines in record.runs().items():
        launches = by_run[run] = []
        for entry in lines:
            if not record_files.is_collective(entry):
                continue  # point-to-point blocks: no collective instance
            annotation = entry["annotation"]
            launches.append(Launch(
                rank if rank is not None else -1, str(entry["group"]), int(entry["seq"]),
                str(annotation[V.COLLECTIVE_NAME]), record_files.size_of(annotation)[2],
                int(annotation.get(V.GROUP_SIZE, 1)), entry["monotonic_ns"] / 1e3, None,
                entry.get("call_site"), str(annotation.get(V.PG_DESC, "")),
                wall_us=(entry["wall_ns"] / 1e3 if isinstance(entry.get("wall_ns"), int)
                         else None), group_ranks=group_ranks(annotation),
                dtype=str(annotation.get(V.DTYPE, ""))))
    for launches in by_run.values():
        if launches and all(launch.wall_us is not None for launch in launches):
            offset = statistics.median(launch.wall_us - launch.start_us  # type: ignore[operator]
                                       for launch in launches)
            for launch in launches:
                launch.start_us += offset
    return rank, by_run, record.host


#: gloo's profiler range name -> the "Collective name"s of launches that run as it (gloo runs
#: a reduce-scatter of one tensor — FSDP2's gradients — as an all-reduce).
_GLOO_NAMES = {
    "all_reduce": {"allreduce", "allreduce_coalesced", "_reduce_scatter_base",
                   "reduce_scatter_tensor_coalesced"},
    "all_gather": {"all_gather", "_allgather_base", "allgather_into_tensor_coalesced"},
    "reduce_scatter": {"reduce_scatter", "_reduce_scatter_base",
                       "reduce_scatter_tensor_coalesced"},
    "broadcast": {"broadcast"}, "reduce": {"reduce"}, "barrier": {"barrier"},
    "all_to_all": {"all_to_all", "all_to_allv"}, "gather": {"gather"}, "scatter": {"scatter"},
}


def _fits_gloo(range_name: str, collective: str) -> bool:
    names = _GLOO_NAMES.get(range_name)
    return names is None or collective in names


def join(rank: int, traced: list[Launch], gloo: list[GlooRange],
         recorded: list[Launch], problems: list[str], where: str) -> list[Launch]:
    """One rank's launches from its trace and its record file (either may be empty)."""
    if not recorded:
        return traced
    if traced:  # call sites for the trace's launches: the records of the same group, in order
        by_group: dict[str, list[Launch]] = defaultdict(list)
        for launch in recorded:
            by_group[launch.group].append(launch)
        for group, kernels in _by_group(traced).items():
            records = by_group.get(group, [])
            offset = _alignment(kernels, records)
            if offset is None:
                problems.append(f"{where}: group {group}: the trace's {len(kernels)} collectives "
                                f"do not line up with the record file's {len(records)}: no "
                                "call sites taken from it")
                continue
            for kernel, record in zip(kernels, records[offset:], strict=False):
                kernel.call_site = record.call_site
        return traced
    if gloo:  # gloo: the ranges are the launches; the records name them
        found = _gloo_alignment(gloo, recorded)
        if found is None:
            problems.append(f"{where}: its {len(gloo)} gloo collectives do not line up with "
                            f"one stretch of the record file's {len(recorded)} (or with more "
                            "than one): give the record file alone")
            return []
        offset, pairs = found
        return [Launch(rank, r.group, r.seq, r.collective, r.size_bytes, r.group_size, g.start,
                       g.end, r.call_site, r.group_desc, step=g.step, group_ranks=r.group_ranks,
                       dtype=r.dtype)
                for r, g in zip(recorded[offset:], (gloo[j] for j in pairs), strict=False)]
    return recorded


#: A gloo range starts after its launch is entered; the two wall clocks (the record file's
#: ``time.time_ns()``, the profiler's converted one) may differ by this much.
WALL_CLOCK_TOLERANCE_US = 2000.0


def _gloo_alignment(gloo: list[GlooRange], records: list[Launch]
                    ) -> tuple[int, list[int]] | None:
    """Where the trace's gloo ranges start in the record file (the profiler saw a window of
    the run), and which range is each record's there (``_pair_gloo``). Where both give
    wall-clock times (record files that say, traces with a time base): the stretch each of
    whose launches was entered just before its range started — exactly, a training loop's
    repeats are a step apart. Else the stretch whose entry times keep the steadiest distance
    to the ranges' starts (two clocks, one host). None where no stretch fits, or two fit
    alike."""
    anchored = all(g.wall_us is not None for g in gloo) and all(r.wall_us is not None
                                                                for r in records)
    offsets = range(len(records) - len(gloo) + 1)
    if anchored:  # a stretch begins with a launch entered before the first range started:
        limit = min(g.wall_us for g in gloo) + WALL_CLOCK_TOLERANCE_US  # the latest few
        offsets = [o for o in offsets if records[o].wall_us <= limit][-4 * PAIR_WINDOW:]
    fits = []
    for offset in offsets:
        window = records[offset:offset + len(gloo)]
        pairs = _pair_gloo(gloo, window)
        if pairs is None:
            continue
        if anchored:
            gaps = [gloo[j].wall_us - r.wall_us for j, r in zip(pairs, window, strict=True)]
            if min(gaps) >= -WALL_CLOCK_TOLERANCE_US:
                fits.append((max(gaps), offset, pairs))
        else:
            gaps = [gloo[j].start - r.start_us for j, r in zip(pairs, window, strict=True)]
            fits.append((max(gaps) - min(gaps), offset, pairs))
    if not fits:
        return None
    fits.sort(key=lambda fit: fit[:2])
    if len(fits) > 1 and fits[1][0] < 2 * fits[0][0] + 50.0:
        return None  # ambiguous
    return fits[0][1], fits[0][2]


#: How far apart in start order a range may be from its launch's place: gloo runs a group's
#: queue on two worker threads, so two launches entered back to back may start swapped.
PAIR_WINDOW = 8
#: Collectives whose one input is as large as the record's message.
_SAME_SIZE = frozenset({"allreduce", "broadcast", "reduce"})


def _pair_gloo(gloo: list[GlooRange], records: list[Launch]) -> list[int] | None:
    """Each record's range (an index into ``gloo``, in start order), by identity: the first
    range not yet taken, among the next ``PAIR_WINDOW``, whose collective fits the record's,
    whose input's size is the record's (where the profiler recorded shapes), and that ran on
    a thread of the record's group (a gloo worker thread serves one group; preferred, not
    required). None where a record has no such range."""
    taken = [False] * len(gloo)
    thread_group: dict[Any, str] = {}
    first_free = 0
    pairs = []
    for record in records:
        while first_free < len(gloo) and taken[first_free]:
            first_free += 1
        chosen = fallback = None
        for j in range(first_free, min(len(gloo), first_free + PAIR_WINDOW)):
            one = gloo[j]
            if taken[j] or not _fits_gloo(one.name, record.collective):
                continue
            if (one.size_bytes is not None and record.collective in _SAME_SIZE
                    and one.size_bytes != record.size_bytes):
                continue
            if thread_group.get(one.thread, record.group) == record.group:
                chosen = j
                break
            if fallback is None:
                fallback = j
        chosen = chosen if chosen is not None else fallback
        if chosen is None:
            return None
        taken[chosen] = True
        thread_group.setdefault(gloo[chosen].thread, record.group)
        pairs.append(chosen)
    return pairs


def _by_group(launches: list[Launch]) -> dict[str, list[Launch]]:
    groups: dict[str, list[Launch]] = defaultdict(list)
    for launch in launches:
        groups[launch.group].append(launch)
    return groups


def _alignment(kernels: list[Launch], records: list[Launch]) -> int | None:
    """Where the trace's launches start in the record file's (the profiler saw a window of
    the run): the first offset at which every launch matches; None if none does."""
    def same(a: Launch, b: Launch) -> bool:
        return a.collective == b.collective and a.size_bytes == b.size_bytes

    for offset in range(len(records) - len(kernels) + 1):
        if all(same(k, r) for k, r in zip(kernels, records[offset:], strict=False)):
            return offset
    return None


def rows_of_trace(trace_path: Path, record_path: Path | None = None, run: str | None = None,
                  host: str | None = None, scanned: tuple[Any, Any, Any] | None = None) -> Any:
    """One rank's rows from its exported trace (annotated or eager NCCL kernels, gloo's ranges)
    joined with its record file's lines of ``run`` (call sites; gloo's groups and sizes); None
    where the trace holds no collective to make a row of. ``scanned``: the trace as the job
    holds it already, (``files.Trace``, ``annotate.Scan``, ``annotate.Patches`` or None)."""
    import os

    from autoannot.traces import rows

    if scanned is None:
        from autoannot.traces.annotate import Scan

        trace = files.Trace(Path(trace_path))
        scanned = (trace, Scan.of(trace), None)
    trace = scanned[0]
    rank, launches, gloo = launches_in(*scanned)
    recorded: list[Any] = []
    if record_path is not None and Path(record_path).is_file():
        record_rank, by_run, record_host = record_launches(Path(record_path))
        recorded = by_run.get(run, []) if run is not None else []
        rank = rank if rank is not None else record_rank
        host = host or record_host
    if rank is None:
        return None
    for launch in launches:
        launch.rank = rank
    problems: list[str] = []
    joined = join(rank, launches, gloo, recorded, problems, str(trace_path))
    if not launches and not gloo:
        return None  # the record file alone is no trace's rows
    if not joined:  # collectives there, but none could be made a row of: say why
        raise files.TraceError("; ".join(problems) or f"{trace_path}: its {len(gloo)} gloo "
                               "collectives have no record file lines to name them (run with "
                               "AUTOANNOT_RECORD)")
    base = trace.metadata().get("baseTimeNanoseconds")
    return rows.from_launches(joined, rank, run=run, host=host, clock="trace",
                         base_ns=base if isinstance(base, int) else None,
                         source=Path(trace_path).name,
                         extra={"pid": os.getpid(), "problems": problems} if problems
                         else {"pid": os.getpid()})


def read_rows_files(paths: Iterable[Path], run: str | None = None,
                    heads_only: bool = False) -> dict[int, Any]:
    """Rows files by rank, of one run (``run``: rows of other runs are left out, and none
    may be left; else the only one: TraceError naming them where they hold several), a rank
    given twice refused. ``heads_only``: their columns are left to be read one file at a time
    (``matching.analyze_rows``)."""
    from autoannot.traces import rows, runs

    paths = list(paths)
    if not paths:
        return {}
    found: dict[str, list[Path]] = {}
    read: list[tuple[Path, Any]] = []
    for path in paths:
        one = rows.read_head(path)[0] if heads_only else rows.read(path)
        read.append((path, one))
        found.setdefault(one.run or runs.NO_RUN, []).append(path)
    chosen = run if run is not None else runs.choose(found, None)
    by_rank: dict[int, Any] = {}
    where: dict[int, Path] = {}
    for path, one in read:
        if (one.run or runs.NO_RUN) != chosen:
            continue
        if one.rank in by_rank:
            raise files.TraceError(f"{where[one.rank]} and {path} are both rank {one.rank}'s "
                                   "rows: give one per rank of one job")
        by_rank[one.rank], where[one.rank] = one, path
    return by_rank


def analyze_files(traces: Iterable[Path], records: Iterable[Path], jobs: int | None = None,
                  progress: bool = False, run: str | None = None,
                  rows: Iterable[Path] = (), include_warmup: bool = False) -> Analysis:
    """Read every trace (on ``jobs`` processes), record file and rows file (``traces.rows``),
    join them per rank, and match instances. Record files holding several runs of a job:
    ``run`` names the one to line up (TraceError naming them all where it is None). A rank's
    rows stand for its trace and record file (they were made from them). Rows alone are
    matched in whole-array steps (``matching``: thousands of ranks)."""
    from autoannot.traces import parallel, runs

    traces, records, rows = list(traces), list(records), list(rows)
    rows_of = read_rows_files(rows, run, heads_only=not traces and not records)
    if not traces and not records and rows_of:
        from autoannot.traces import matching

        return matching.analyze_rows(list(rows_of.values()), include_warmup)
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
    cut_notes: list[str] = []
    read_records = [(path, *record_launches(path, cut_notes)) for path in records]
    found: dict[str, list[Path]] = {}
    for path, _, by_run, _ in read_records:
        for name in by_run:
            found.setdefault(name, []).append(path)
    chosen = runs.choose(found, run)
    hosts: dict[int, str | None] = {}
    for path, rank, by_run, host in read_records:
        launches = by_run.get(chosen, []) if chosen is not None else []
        if rank is None:
            raise files.TraceError(f"{path}: names no rank (written before the process group "
                                   "was up, with no RANK set): cannot place it")
        if rank in recorded:
            raise files.TraceError(f"{recorded[rank][1]} and {path} are both rank {rank}'s "
                                   "record file")
        recorded[rank] = (launches, path)
        hosts[rank] = host
    per_rank: dict[int, list[Launch]] = {}
    from autoannot.traces.rows import to_launches

    notes = []
    for rank, one in rows_of.items():
        per_rank[rank] = to_launches(one)
        given = [str(p) for p in (traced.pop(rank, (None, None, None))[2],
                                  recorded.pop(rank, (None, None))[1]) if p is not None]
        if given:
            notes.append(f"rank {rank}: its rows ({one.source or 'rows file'}) stand for "
                         f"{' and '.join(given)}")
    for rank in sorted(set(traced) | set(recorded)):
        launches, gloo, path = traced.get(rank, ([], [], None))
        records, record_path = recorded.get(rank, ([], None))
        where = str(path or record_path)
        per_rank[rank] = join(rank, launches, gloo, records, problems, where)
        if not per_rank[rank]:
            problems.append(f"{where}: no collective to line up (eager NCCL kernels with "
                            "collective args, annotated graphed ones, or a record file)")
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
    analysis = analyze(per_rank, include_warmup)
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


# --- text ----------------------------------------------------------------------------------------

def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e3:.2f} ms" if value >= 1e4 else f"{value:.1f} us"


def lead(analysis: Analysis) -> list[str]:
    """The first lines to say of an analysis: missing ranks first (never an all-clear while a
    rank is missing), then where the largest delay began."""
    lines = [f"MISSING: {describe_missing(entry)}" for entry in analysis.missing]
    origins = analysis.origins(1)
    if origins:
        top = origins[0]
        lines.append(
            f"rank {top['rank']} held the others up most: {_us(top['blamed_us'])} of their "
            f"waiting began where it arrived {_us(top['late_us'])} late, at "
            f"{top['group_desc'] or top['group']} #{top['seq']} {top['collective']}"
            + (f" (step {top['step']})" if top["step"] >= 0 else "")
            + f" {'at ' + top['call_site'] if top['call_site'] else '(no call site recorded)'}")
    elif analysis.instances:
        lines.append("no delay found outside warm-up: every instance started within "
                     f"{IN_STEP_US:g} us on its ranks, or its lateness came from warm-up"
                     if not analysis.warmup_counted else
                     f"no rank arrived late: every instance started within {IN_STEP_US:g} us")
    return lines


def warmup_note(analysis: Analysis) -> str | None:
    """What was left out of the ranking as warm-up, if anything."""
    if analysis.warmup_counted or not len(analysis.instances):
        return None
    f = analysis.figures()
    count = int(f.warmup.sum())
    if not count:
        return None
    worst = float(f.skew[f.warmup].max())
    return (f"{count_of(count, 'warm-up instance')} (profiler step 0, and each group's first "
            f"collective: process and communicator start-up; largest skew {_us(worst)}): shown "
            "but left out of the ranking (--include-warmup counts them)")


def format_report(analysis: Analysis, top: int = 10) -> str:
    by_skew = analysis.largest_skews(top)
    column = {rank: c for c, rank in enumerate(analysis.ranks)}
    lines = [*lead(analysis),
             f"{len(analysis.instances)} collective instances on {len(analysis.ranks)} ranks",
             "",
             f"{'rank':>4} {'waited in collectives':>22} {'others waited for it':>21} "
             f"{'last to arrive':>15}"]
    for r in analysis.per_rank():
        lines.append(f"{r['rank']:>4} {_us(r['waited_us']):>22} "
                     f"{_us(r['others_waited_for_it_us']):>21} {r['last_to_arrive']:>15}")
    origins = analysis.origins(top)
    if origins:
        lines += ["", "where the waiting began (each delay blamed once, where it started):",
                  f"{'rank':>4} {'blamed':>10} {'late by':>10} {'step':>4}  {'group':14} "
                  f"{'#':>5} {'collective':24} call site"]
        for o in origins:
            group = f"{o['group_desc'] or '?'} ({o['group']})"
            lines.append(f"{o['rank']:>4} {_us(o['blamed_us']):>10} {_us(o['late_us']):>10} "
                         f"{o['step'] if o['step'] >= 0 else '-':>4}  {group[:14]:14} "
                         f"{o['seq']:>5} {o['collective'][:24]:24} {o['call_site'] or '-'}")
    lines += ["", f"top {len(by_skew)} instances by skew:",
              f"{'group':14} {'#':>5} {'collective':24} {'size':>10} {'last':>5} {'skew':>10} "
              f"{'transfer':>10}  call site (the last rank's)"]
    from autoannot.traces.units import size_text as _size

    for instance in by_skew:
        straggler, skew, transfer, _ = analysis.summary_of(instance)
        site = (analysis.site(instance.index, column[straggler]) if straggler is not None
                else None)
        group = f"{instance.group_desc or '?'} ({instance.group})"
        lines.append(f"{group[:14]:14} {instance.seq:>5} {instance.collective[:24]:24} "
                     f"{_size(instance.size_bytes):>10} "
                     f"{'-' if straggler is None else straggler:>5} {_us(round(skew, 3)):>10} "
                     f"{_us(None if transfer is None else round(transfer, 3)):>10}  "
                     f"{site or '-'}")
    fitted = [c for c in analysis.clocks if c.instances]
    if fitted:
        lines += ["", "clocks (each rank's offset from rank "
                  f"{analysis.clocks[0].rank}'s, fitted on the instances' end times):"]
        for c in fitted:
            lines.append(f"  rank {c.rank}: {c.offset_us:+.1f} us, spread {c.spread_us:.1f} us "
                         f"over {c.instances} instances: "
                         + ("taken out" if c.applied else "within its spread: left as is"))
    for problem in analysis.problems:
        lines.append(f"not matched: {problem}")
    for note in [*analysis.notes, warmup_note(analysis)]:
        if note:
            lines.append(f"note: {note}")
    return "\n".join(lines)


CSV_FIELDS = ("group", "group_desc", "seq", "collective", "size_bytes", "straggler", "skew_us",
              "transfer_us", "busbw_gbps", "rank", "start_us", "wait_us", "call_site")


def write_json(analysis: Analysis, path: Path) -> None:
    """One row per instance, each made and written in turn (a job of a million instances of
    thousands of ranks is never held as one text)."""
    def pieces() -> Iterator[str]:
        yield "["
        for number, instance in enumerate(analysis.instances):
            yield ("\n" if number == 0 else ",\n") + json.dumps(analysis.row(instance))
        yield "\n]\n"

    files.atomic_write_lines(str(path), pieces())


def write_csv(analysis: Analysis, path: Path) -> None:
    """One CSV row per instance and rank, written an instance at a time."""
    import csv
    import io

    def pieces() -> Iterator[str]:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(CSV_FIELDS)
        for instance in analysis.instances:
            row = analysis.row(instance)
            head = [row[k] for k in CSV_FIELDS[:9]]
            for rank, part in row["ranks"].items():
                writer.writerow([*head, rank, part["start_us"], part["wait_us"],
                                 part["call_site"]])
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
        yield buffer.getvalue()

    files.atomic_write_lines(str(path), pieces())

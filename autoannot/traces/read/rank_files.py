"""A rank's launches, read from what the job wrote: its trace, its record file, its rows.

A rank's launches come from

* its trace: NCCL kernels that carry collective args (eager traces; graphed traces annotated
  by ``autoannot annotate``, or raw with their ledger beside them, annotated in memory), in
  start order per group (torch's ``Seq`` where the kernel carries it); gloo's profiler ranges
  (``gloo:all_reduce``) once a record file names them;
* its record file (``AUTOANNOT_RECORD``): group, sequence, call site and the time each launch
  was entered, for every launch of the process;
* its rows (``table.rows``), made from both at export.

Given both a trace and a record file, the record file gives the trace's launches their call
sites and (gloo) their groups and sizes: kernels by sequence; gloo's ranges by the wall clock
and by identity (``_pair_gloo``). A rank with only a record file is timed by its entry times
(arrivals, no transfer time). Sequences that do not line up are reported, never guessed.
Record files time entries by each process's monotonic clock put on the wall clock's epoch
(see ``record_launches``): one clock on a host, and across hosts as close as their clocks are
kept.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from autoannot.describe import vocabulary as V
from autoannot.traces import files
from autoannot.traces.table.launch import Launch


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
    from autoannot.traces.read.annotate import Scan

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


def gloo_needs_records(traces: list[Path], ranges: int) -> files.TraceError:
    """The refusal of gloo traces given alone: gloo's profiler ranges carry no process group
    and no sequence number, so nothing lines them up across ranks; the record file does."""
    shown = ", ".join(p.name for p in traces[:3]) + (", ..." if len(traces) > 3 else "")
    return files.TraceError(
        f"{shown}: {len(traces)} gloo trace{'s' if len(traces) != 1 else ''} with {ranges} gloo "
        "collectives and nothing to line them up by (gloo's profiler ranges name no process "
        "group or sequence): give the rows the job wrote beside them (AUTOANNOT=1 writes them "
        "at export), or run it with AUTOANNOT_RECORD='DIR/rank{rank}.jsonl' too and give its "
        "record files (with the traces, or alone)")


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
                    ) -> list[tuple[int | None, dict[str, list[Launch]], str | None]]:
    """Each rank's part of a record file (one, unless several ranks wrote to it:
    ``record_files.RecordFile.by_rank``): its rank, launches (entry times, call sites) per run
    of the job, and host (None where its lines do not say).

    Entry times are the process's monotonic clock (steady, but each host's own: hosts' differ
    by hours), moved onto the wall clock where the lines carry it: by the median of
    ``wall_ns - monotonic_ns`` over the run's lines, so a run keeps its steady clock and ranks
    of different hosts share an epoch (as well as the hosts' clocks agree)."""
    from autoannot.traces.read import record_files

    record = record_files.read(path, ("seq", "group", "monotonic_ns"),
                               "files written before autoannot 0.1 (no seq) cannot be lined up "
                               "across ranks")
    if record.cut is not None and notes is not None:
        notes.append(f"{path}:{record.cut}: its last line was cut short (the job was killed "
                     "while writing it?): left out")
    parts = record.by_rank()
    if len(parts) > 1 and notes is not None:
        notes.append(f"{path}: holds the lines of {len(parts)} ranks (one path for every "
                     "rank, or files put together): read rank by rank")
    return [(part.rank, _launches_by_run(part), part.host) for part in parts]


def rank_record(path: Path, rank: int | None
                ) -> tuple[int | None, dict[str, list[Launch]], str | None]:
    """The part of a record file that is ``rank``'s (its only part where ``rank`` is None);
    (None, {}, None) where it holds no line of that rank."""
    parts = record_launches(path)
    if rank is None:
        return parts[0] if len(parts) == 1 else (None, {}, None)
    return next((part for part in parts if part[0] == rank), (None, {}, None))


def _launches_by_run(record: Any) -> dict[str, list[Launch]]:
    """One rank's record lines as launches, per run."""
    from autoannot.traces.read import record_files

    rank = record.rank
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
    return by_run


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
    whose input's size is the record's (where the profiler recorded shapes), on the thread
    its Work completed on (where the record knows it: a ring's async launch; two launches
    gloo ran out of order are told apart so, shapes recorded or not), and that ran on a
    thread of the record's group (a gloo worker thread serves one group; preferred, not
    required). None where a record has no such range."""
    taken = [False] * len(gloo)
    thread_group: dict[Any, str] = {}
    first_free = 0
    pairs = []
    for record in records:
        while first_free < len(gloo) and taken[first_free]:
            first_free += 1
        chosen = fallback = None
        ran_on = record.finished_thread  # (where known: the thread gloo ran it on)
        if ran_on is not None and not any(
                gloo[j].thread == ran_on and not taken[j]
                for j in range(first_free, min(len(gloo), first_free + PAIR_WINDOW))):
            ran_on = None  # (told on another thread: it completed before it was asked)
        for j in range(first_free, min(len(gloo), first_free + PAIR_WINDOW)):
            one = gloo[j]
            if taken[j] or not _fits_gloo(one.name, record.collective):
                continue
            if (one.size_bytes is not None and record.collective in _SAME_SIZE
                    and one.size_bytes != record.size_bytes):
                continue
            if ran_on is not None and one.thread != ran_on:
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
                  host: str | None = None, scanned: tuple[Any, Any, Any] | None = None,
                  kept: tuple[int | None, list[Any]] | None = None) -> Any:
    """One rank's rows from its exported trace (annotated or eager NCCL kernels, gloo's ranges)
    joined with its record file's lines of ``run`` (call sites; gloo's groups and sizes); None
    where the trace holds no collective to make a row of. ``scanned``: the trace as the job
    holds it already, (``files.Trace``, ``annotate.Scan``, ``annotate.Patches`` or None);
    ``kept``: where no record file is given, the rank and launches its ring kept
    (``read.ring_files.launches_of``), joined as a record file's."""
    import os

    from autoannot.traces.table import rows

    if scanned is None:
        from autoannot.traces.read.annotate import Scan

        trace = files.Trace(Path(trace_path))
        scanned = (trace, Scan.of(trace), None)
    trace = scanned[0]
    rank, launches, gloo = launches_in(*scanned)
    recorded: list[Any] = []
    if record_path is not None and Path(record_path).is_file():
        record_rank, by_run, record_host = rank_record(Path(record_path), rank)
        recorded = by_run.get(run, []) if run is not None else []
        rank = rank if rank is not None else record_rank
        host = host or record_host
    elif kept is not None:
        rank = rank if rank is not None else kept[0]
        recorded = list(kept[1])
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
                               "AUTOANNOT_RING or AUTOANNOT_RECORD)")
    base = trace.metadata().get("baseTimeNanoseconds")
    return rows.from_launches(joined, rank, run=run, host=host, clock="trace",
                         base_ns=base if isinstance(base, int) else None,
                         source=Path(trace_path).name,
                         extra={"pid": os.getpid(), "problems": problems} if problems
                         else {"pid": os.getpid()})


def read_rows_files(paths: Iterable[Path], run: str | None = None,
                    heads_only: bool = False, others: dict[str, list[Path]] | None = None
                    ) -> tuple[dict[int, Any], str | None]:
    """Rows files by rank, of one run, and that run: ``run``, or the only one of the rows and
    ``others`` (the runs other inputs of the same command hold, run -> files) together —
    TraceError naming them where they hold several (``runs.choose``); a rank given twice
    refused. ``heads_only``: their columns are left to be read one file at a time
    (``matching.analyze_rows``)."""
    from autoannot.traces.read import runs
    from autoannot.traces.table import rows

    paths = list(paths)
    found: dict[str, list[Path]] = {name: list(where) for name, where in (others or {}).items()}
    read: list[tuple[Path, Any]] = []
    for path in paths:
        one = rows.read_head(path)[0] if heads_only else rows.read(path)
        read.append((path, one))
        found.setdefault(one.run or runs.NO_RUN, []).append(path)
    chosen = runs.choose(found, run)
    by_rank: dict[int, Any] = {}
    where: dict[int, Path] = {}
    for path, one in read:
        if (one.run or runs.NO_RUN) != chosen:
            continue
        if one.rank in by_rank:
            raise files.TraceError(f"{where[one.rank]} and {path} are both rank {one.rank}'s "
                                   "rows: give one per rank of one job")
        by_rank[one.rank], where[one.rank] = one, path
    return by_rank, chosen

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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoannot import vocabulary as V
from autoannot.traces import files

#: Below this, arrivals count as simultaneous: no straggler is named.
IN_STEP_US = 2.0


@dataclass(slots=True)
class Launch:
    """One rank's part in one collective."""

    rank: int
    group: str  # the process group's name ("0", "1", ...)
    seq: int  # its position in the group's sequence on this rank
    collective: str  # "Collective name"
    size_bytes: int
    group_size: int
    start_us: float  # in the rank's own time base (its trace's, or monotonic for records)
    end_us: float | None  # None where only the entry is known (a record file alone)
    call_site: str | None = None
    group_desc: str = ""
    #: Timed by a GPU kernel: it ends within microseconds on every rank (what fits clocks).
    #: gloo's CPU ranges end apart (its algorithm runs on each rank's CPU): not used to fit.
    kernel: bool = False
    #: When it was entered on the wall clock (us since the epoch; record files that say).
    wall_us: float | None = None


@dataclass
class Instance:
    """One collective on all its ranks; its times are in ``Analysis``'s matrices."""

    group: str
    seq: int
    collective: str
    size_bytes: int
    group_desc: str
    index: int  # its row in the matrices
    kernel: bool = False  # every rank's part timed by a GPU kernel (see Launch.kernel)


@dataclass
class ClockFit:
    rank: int
    offset_us: float  # this rank's clock minus the reference rank's
    spread_us: float  # median absolute deviation of the per-instance estimates
    instances: int
    applied: bool


_NAN = float("nan")


@dataclass
class Figures:
    """Per instance, as numpy arrays: its group and collective (codes into the name lists), size,
    member ranks, skew, straggler (a column of ``Analysis.ranks``; -1: in step), transfer (NaN:
    unknown) and last arrival."""

    group: Any
    collective: Any
    size_bytes: Any
    members: Any
    skew: Any
    straggler: Any
    transfer: Any
    last: Any
    group_names: list[str] = field(default_factory=list)
    group_descs: list[str] = field(default_factory=list)
    collective_names: list[str] = field(default_factory=list)

    @staticmethod
    def empty(count: int) -> Figures:
        import numpy as np

        return Figures(np.zeros(count, np.int32), np.zeros(count, np.int32),
                       np.zeros(count, np.int64), np.zeros(count, np.int32),
                       np.zeros(count), np.full(count, -1, np.int32), np.full(count, np.nan),
                       np.zeros(count))


@dataclass
class Analysis:
    """The instances, with every rank's start and end in two instance x rank matrices (row-major
    ``array('d')``, NaN where a rank took no part): 2M launches take 32 MB, not 2M objects."""

    instances: list[Instance]
    clocks: list[ClockFit]
    problems: list[str] = field(default_factory=list)  # what could not be matched, and why
    ranks: list[int] = field(default_factory=list)
    starts: Any = None  # array('d'), len(instances) x len(ranks)
    ends: Any = None
    sites: dict[tuple[int, int], str] = field(default_factory=dict)  # (instance, column) -> site
    notes: list[str] = field(default_factory=list)  # what to keep in mind (not a failure)
    def figures(self) -> Figures:
        """Every instance's figures as arrays (numpy), for whole-job views."""
        import numpy as np

        groups: dict[tuple[str, str], int] = {}
        collectives: dict[str, int] = {}
        table = Figures.empty(len(self.instances))
        for i, instance in enumerate(self.instances):
            straggler, skew, transfer, last = self.summary_of(instance)
            table.group[i] = groups.setdefault((instance.group, instance.group_desc),
                                               len(groups))
            table.collective[i] = collectives.setdefault(instance.collective, len(collectives))
            table.size_bytes[i] = instance.size_bytes
            table.members[i] = len(self._times(instance))
            table.skew[i] = skew
            table.straggler[i] = -1 if straggler is None else self.ranks.index(straggler)
            table.transfer[i] = np.nan if transfer is None else transfer
            table.last[i] = last
        table.group_names = [g for g, _ in groups]
        table.group_descs = [d for _, d in groups]
        table.collective_names = list(collectives)
        return table

    def largest_skews(self, top: int) -> list[Instance]:
        """The ``top`` instances of largest skew, largest first."""
        import numpy as np

        skew = self.figures().skew
        if top < len(skew):
            head = np.sort(np.argpartition(-skew, top)[:top])  # (ties: in instance order)
        else:
            head = np.arange(len(skew))
        head = head[np.argsort(-skew[head], kind="stable")]
        return [self.instances[int(i)] for i in head]

    def site(self, index: int, column: int) -> str | None:
        """The call site of rank ``ranks[column]``'s part in instance ``index``."""
        return self.sites.get((index, column))

    def launch_arrays(self) -> tuple[Any, Any, Any, Any]:
        """Every rank's part in every instance as numpy arrays: (instance, column, start,
        end), by instance."""
        import numpy as np

        n, width = len(self.instances), len(self.ranks)
        starts = np.asarray(self.starts, dtype=np.float64).reshape(n, width)
        ends = np.asarray(self.ends, dtype=np.float64).reshape(n, width)
        instance, column = np.nonzero(~np.isnan(starts))
        return instance, column, starts[instance, column], ends[instance, column]

    def _times(self, instance: Instance) -> list[tuple[int, float, float]]:
        """(rank, start, end) of the ranks that took part."""
        width = len(self.ranks)
        base = instance.index * width
        starts, ends = self.starts, self.ends
        return [(rank, starts[base + c], ends[base + c]) for c, rank in enumerate(self.ranks)
                if starts[base + c] == starts[base + c]]  # not NaN

    def summary_of(self, instance: Instance) -> tuple[int | None, float, float | None, float]:
        """(straggler or None when in step, skew, transfer or None, last arrival)."""
        times = self._times(instance)
        first = min(t[1] for t in times)
        straggler, last, end = max(times, key=lambda t: (t[1], t[0]))
        transfer = None if end != end else end - last
        skew = last - first
        return (straggler if skew >= IN_STEP_US else None), skew, transfer, last

    def _parts(self, instance: Instance) -> list[tuple[int, float, str | None]]:
        """(rank, start, call site) of the ranks that took part."""
        column = {rank: c for c, rank in enumerate(self.ranks)}
        return [(rank, start, self.site(instance.index, column[rank]))
                for rank, start, _ in self._times(instance)]

    def row(self, instance: Instance) -> dict[str, Any]:
        from autoannot.traces.summary import bus_factor

        straggler, skew, transfer, last = self.summary_of(instance)
        parts = self._parts(instance)
        busbw = None
        if transfer and transfer > 0 and instance.size_bytes:
            busbw = instance.size_bytes / (transfer * 1e-6) / 1e9 * bus_factor(
                instance.collective, len(parts))
        return {
            "group": instance.group, "group_desc": instance.group_desc, "seq": instance.seq,
            "collective": instance.collective, "size_bytes": instance.size_bytes,
            "straggler": straggler, "skew_us": round(skew, 3),
            "transfer_us": None if transfer is None else round(transfer, 3),
            "busbw_gbps": None if busbw is None else round(busbw, 3),
            "ranks": {str(rank): {"start_us": round(start, 3),
                                  "wait_us": round(last - start, 3), "call_site": site}
                      for rank, start, site in parts},
        }

    def rows(self) -> list[dict[str, Any]]:
        return [self.row(instance) for instance in self.instances]

    def per_rank(self) -> list[dict[str, Any]]:
        """Per rank: time waiting in collectives, and time the others waited for it."""
        waited: dict[int, float] = defaultdict(float)
        caused: dict[int, float] = defaultdict(float)
        late: dict[int, int] = defaultdict(int)
        for instance in self.instances:
            straggler, _, _, last = self.summary_of(instance)
            total = 0.0
            for rank, start, _ in self._times(instance):
                waited[rank] += last - start
                total += last - start
            if straggler is not None:
                caused[straggler] += total
                late[straggler] += 1
        return [{"rank": r, "waited_us": round(waited[r], 3),
                 "others_waited_for_it_us": round(caused[r], 3), "last_to_arrive": late[r]}
                for r in self.ranks]


# --- reading -----------------------------------------------------------------------------------

#: A gloo range: (name, start, end, start on the wall clock in us since the epoch, where the
#: trace gives its time base).
GlooRange = tuple[str, float, float, float | None]


def trace_launches(path: Path) -> tuple[int | None, list[Launch], list[GlooRange]]:
    """A trace's rank, its NCCL launches with collective args, and its gloo ranges in start
    order."""
    from autoannot.traces.annotate import kernel_family
    from autoannot.traces.summary import DTYPE_BYTES

    trace = files.Trace(path)
    rank = trace.metadata().get("distributedInfo", {}).get("rank")
    rank = rank if isinstance(rank, int) else None
    kernels: list[tuple[float, float, dict[str, Any]]] = []
    gloo: list[GlooRange] = []
    base = trace.metadata().get("baseTimeNanoseconds")  # Kineto's: its ts count from it
    base_us = base / 1e3 if isinstance(base, int | float) and base > 0 else None
    events = (trace.document["traceEvents"] if trace.document is not None
              else (json.loads("{" + chunk + "}") for chunk in trace._chunks()
                    if "nccl" in chunk or '"gloo:' in chunk))
    for event in events:
        if not isinstance(event, dict):
            continue
        cat, name = event.get("cat"), str(event.get("name", ""))
        ts, dur = float(event.get("ts", 0)), float(event.get("dur", 0))
        if cat == "user_annotation" and name.startswith("gloo:"):
            gloo.append((name[len("gloo:"):], ts, ts + dur,
                         None if base_us is None else base_us + ts))
        elif cat == "kernel" and kernel_family(name):
            args = event.get("args") or {}
            if V.COLLECTIVE_NAME in args:
                kernels.append((ts, ts + dur, args))
    kernels.sort(key=lambda k: k[0])
    gloo.sort(key=lambda g: g[1])
    counters: dict[str, int] = defaultdict(int)
    launches = []
    for start, end, args in kernels:
        group = str(args.get(V.PG_NAME, "?"))
        seq = args.get("Seq")
        if not isinstance(seq, int):
            seq = counters[group]
        counters[group] += 1
        nelems = max(int(args.get(V.IN_NELEMS, 0)), int(args.get(V.OUT_NELEMS, 0)))
        dtype = str(args.get(V.DTYPE, "?"))
        launches.append(Launch(
            rank if rank is not None else -1, group, seq, str(args[V.COLLECTIVE_NAME]),
            nelems * DTYPE_BYTES.get(dtype, 0), int(args.get(V.GROUP_SIZE, 1)), start, end,
            group_desc=str(args.get(V.PG_DESC, "")), kernel=True))
    return rank, launches, gloo


def record_launches(path: Path) -> tuple[int | None, dict[str, list[Launch]], str | None]:
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
                         else None)))
    for launches in by_run.values():
        if launches and all(launch.wall_us is not None for launch in launches):
            offset = statistics.median(launch.wall_us - launch.start_us  # type: ignore[operator]
                                       for launch in launches)
            for launch in launches:
                launch.start_us += offset
    return rank, by_run, record.host


#: gloo's profiler range name -> the "Collective name"s of launches that run as it.
_GLOO_NAMES = {
    "all_reduce": {"allreduce", "allreduce_coalesced"},
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
    if gloo:  # gloo: the ranges are the launches, in order; the records name them
        offset = _gloo_alignment(gloo, recorded)
        if offset is None:
            problems.append(f"{where}: its {len(gloo)} gloo collectives do not line up with "
                            f"one stretch of the record file's {len(recorded)} (or with more "
                            "than one): give the record file alone")
            return []
        return [Launch(rank, r.group, r.seq, r.collective, r.size_bytes, r.group_size, start,
                       end, r.call_site, r.group_desc)
                for (_, start, end, _), r in zip(gloo, recorded[offset:], strict=False)]
    return recorded


#: A gloo range starts after its launch is entered; the two wall clocks (the record file's
#: ``time.time_ns()``, the profiler's converted one) may differ by this much.
WALL_CLOCK_TOLERANCE_US = 2000.0


def _gloo_alignment(gloo: list[GlooRange], records: list[Launch]) -> int | None:
    """Where the trace's gloo ranges start in the record file (the profiler saw a window of
    the run). Where both give wall-clock times (record files that say, traces with a time
    base): the stretch whose collectives fit the ranges' names and each of whose launches
    was entered just before its range started — exactly, a training loop's repeats are a step
    apart. Else the stretch whose entry times keep the steadiest distance to the ranges'
    starts (two clocks, one host). None where no stretch fits, or two fit alike."""
    anchored = all(g[3] is not None for g in gloo) and all(r.wall_us is not None
                                                             for r in records)
    fits = []
    for offset in range(len(records) - len(gloo) + 1):
        window = records[offset:offset + len(gloo)]
        if not all(_fits_gloo(g[0], r.collective) for g, r in zip(gloo, window, strict=True)):
            continue
        if anchored:
            gaps = [g[3] - r.wall_us for g, r in zip(gloo, window, strict=True)]
            if min(gaps) >= -WALL_CLOCK_TOLERANCE_US:
                fits.append((max(gaps), offset))
        else:
            gaps = [g[1] - r.start_us for g, r in zip(gloo, window, strict=True)]
            fits.append((max(gaps) - min(gaps), offset))
    if not fits:
        return None
    fits.sort()
    if len(fits) > 1 and fits[1][0] < 2 * fits[0][0] + 50.0:
        return None  # ambiguous
    return fits[0][1]


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


# --- matching ------------------------------------------------------------------------------------

def disagreement(group: str, seq: int, how: str) -> str:
    """The problem of an instance its ranks launched differently."""
    return f"group {group}, collective #{seq}: the ranks disagree ({how}): not matched"


def missing_ranks(group: str, seq: int, absent: int, size: int) -> str:
    """The problem of an instance some of its ranks have no trace or record of."""
    return (f"group {group}, collective #{seq}: {absent} of its {size} ranks have no trace or "
            "record of it: left out")


def analyze(per_rank: dict[int, list[Launch]]) -> Analysis:
    """Instances across ranks, clocks fitted, from each rank's launches."""
    from array import array

    problems: list[str] = []
    ranks = sorted(per_rank)
    column = {rank: c for c, rank in enumerate(ranks)}
    keys: dict[tuple[str, int], int] = {}
    first: list[Launch] = []  # each key's first launch: what the others must agree with
    members: list[int] = []
    conflict: dict[int, str] = {}
    for rank in ranks:
        for launch in per_rank[rank]:
            key = (launch.group, launch.seq)
            index = keys.get(key)
            if index is None:
                index = keys[key] = len(first)
                first.append(launch)
                members.append(0)
            members[index] += 1
            seen = first[index]
            if (seen.collective, seen.size_bytes) != (launch.collective, launch.size_bytes) \
                    and {seen.collective, launch.collective} != {"send", "recv"}:
                conflict.setdefault(index, f"rank {seen.rank}: {seen.collective} "
                                    f"{seen.size_bytes} B; rank {rank}: {launch.collective} "
                                    f"{launch.size_bytes} B")
    order = sorted(keys, key=lambda k: (k[0], k[1]))
    instances: list[Instance] = []
    row_of: dict[int, int] = {}
    for key in order:
        index = keys[key]
        launch = first[index]
        size = launch.group_size
        if index in conflict:
            problems.append(disagreement(key[0], key[1], conflict[index]))
            continue
        if members[index] < size:
            problems.append(missing_ranks(key[0], key[1], size - members[index], size))
            continue
        collective = "send/recv" if launch.collective in ("send", "recv") else launch.collective
        row_of[index] = len(instances)
        instances.append(Instance(key[0], key[1], collective, launch.size_bytes,
                                  launch.group_desc, len(instances)))
    width = len(ranks)
    starts = array("d", [_NAN]) * (len(instances) * width)
    ends = array("d", [_NAN]) * (len(instances) * width)
    sites: dict[tuple[int, int], str] = {}
    for instance in instances:
        instance.kernel = True
    for rank in ranks:
        c = column[rank]
        for launch in per_rank[rank]:
            row = row_of.get(keys[(launch.group, launch.seq)])
            if row is None:
                continue
            if not launch.kernel:
                instances[row].kernel = False
            starts[row * width + c] = launch.start_us
            ends[row * width + c] = _NAN if launch.end_us is None else launch.end_us
            if launch.call_site is not None:
                sites[(row, c)] = launch.call_site
    analysis = Analysis(instances, [], problems, ranks, starts, ends, sites)
    analysis.clocks = _fit_clocks(analysis)
    note = far_clocks_note(analysis)
    if note:
        analysis.notes.append(note)
    for fit in analysis.clocks:
        if fit.applied:
            c = column[fit.rank]
            for row in range(len(instances)):
                starts[row * width + c] -= fit.offset_us
                ends[row * width + c] -= fit.offset_us
    return analysis


def far_clocks_note(analysis: Analysis) -> str | None:
    """What to say of clock offsets taken out that are large (ranks of one host share a clock:
    there, an offset means the traces cover different stretches)."""
    far = [fit for fit in analysis.clocks if fit.applied and abs(fit.offset_us) > 50.0]
    if not far:
        return None
    return (f"{len(far)} ranks' clocks are more than 50 us off rank {analysis.ranks[0]}'s (rank "
            f"{far[0].rank}: {far[0].offset_us:+.0f} us), taken out as clock offsets: right "
            "for ranks on other hosts; ranks of one host share a clock, so there the traces "
            "may cover different stretches of the run (profile the same steps on every rank)")


def _fit_clocks(analysis: Analysis) -> list[ClockFit]:
    """Each rank's clock offset from the first rank's, from the instances' end times."""
    ranks = analysis.ranks
    if not ranks:
        return []
    width, ends = len(ranks), analysis.ends
    fits = [ClockFit(ranks[0], 0.0, 0.0, 0, False)]
    kernel_rows = [i.index for i in analysis.instances if i.kernel]
    for c in range(1, width):
        estimates = []
        for row in kernel_rows:
            mine, theirs = ends[row * width + c], ends[row * width]
            if mine == mine and theirs == theirs:  # neither NaN
                estimates.append(mine - theirs)
        if not estimates:
            fits.append(ClockFit(ranks[c], 0.0, 0.0, 0, False))
            continue
        offset = statistics.median(estimates)
        spread = statistics.median(abs(e - offset) for e in estimates)
        applied = abs(offset) > max(1.0, 3 * spread)
        fits.append(ClockFit(ranks[c], offset, spread, len(estimates), applied))
    return fits


def read_rows_files(paths: Iterable[Path], run: str | None = None,
                    heads_only: bool = False) -> dict[int, Any]:
    """Rows files by rank, of one run (``run``, or the only one: TraceError naming them where
    they hold several), a rank given twice refused. ``heads_only``: their columns are left to
    be read one file at a time (``matching.analyze_rows``)."""
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
    return by_rank


def analyze_files(traces: Iterable[Path], records: Iterable[Path], jobs: int | None = None,
                  progress: bool = False, run: str | None = None,
                  rows: Iterable[Path] = ()) -> Analysis:
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

        return matching.analyze_rows(list(rows_of.values()))
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
    read_records = [(path, *record_launches(path)) for path in records]
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
    analysis = analyze(per_rank)
    analysis.problems[:0] = problems
    analysis.notes[:0] = notes
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
            f"ranks {', '.join(map(str, unknown[:8]))} are timed by inputs of no known epoch "
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


def format_report(analysis: Analysis, top: int = 10) -> str:
    try:
        by_skew = analysis.largest_skews(top)
    except ImportError:  # no numpy: the same, one instance at a time
        by_skew = sorted(analysis.instances, key=lambda i: -analysis.summary_of(i)[1])[:top]
    column = {rank: c for c, rank in enumerate(analysis.ranks)}
    lines = [f"{len(analysis.instances)} collective instances on {len(analysis.ranks)} ranks",
             "",
             f"{'rank':>4} {'waited in collectives':>22} {'others waited for it':>21} "
             f"{'last to arrive':>15}"]
    for r in analysis.per_rank():
        lines.append(f"{r['rank']:>4} {_us(r['waited_us']):>22} "
                     f"{_us(r['others_waited_for_it_us']):>21} {r['last_to_arrive']:>15}")
    lines += ["", f"top {len(by_skew)} instances by skew:",
              f"{'group':14} {'#':>5} {'collective':24} {'size':>10} {'last':>5} {'skew':>10} "
              f"{'transfer':>10}  call site (the last rank's)"]
    from autoannot.traces.summary import _size

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
    for note in analysis.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


CSV_FIELDS = ("group", "group_desc", "seq", "collective", "size_bytes", "straggler", "skew_us",
              "transfer_us", "busbw_gbps", "rank", "start_us", "wait_us", "call_site")


def write_json(analysis: Analysis, path: Path) -> None:
    """One row per instance (built one at a time: a million-row job fits in memory)."""
    parts = (json.dumps(analysis.row(instance)) for instance in analysis.instances)
    files.atomic_write_text(str(path), "[\n" + ",\n".join(parts) + "\n]\n")


def write_csv(analysis: Analysis, path: Path) -> None:
    """One CSV row per instance and rank."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_FIELDS)
    for instance in analysis.instances:
        row = analysis.row(instance)
        head = [row[k] for k in CSV_FIELDS[:9]]
        for rank, part in row["ranks"].items():
            writer.writerow([*head, rank, part["start_us"], part["wait_us"], part["call_site"]])
    files.atomic_write_text(str(path), buffer.getvalue())

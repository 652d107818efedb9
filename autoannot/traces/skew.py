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
offset is taken out only where it stands out of its own spread (and reported either way).
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


@dataclass
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


@dataclass
class Instance:
    group: str
    seq: int
    collective: str
    size_bytes: int
    launches: dict[int, Launch]  # rank -> its launch (clock-corrected)

    def starts(self) -> dict[int, float]:
        return {r: launch.start_us for r, launch in self.launches.items()}

    def row(self) -> dict[str, Any]:
        starts = self.starts()
        first, last = min(starts.values()), max(starts.values())
        skew = last - first
        straggler = max(starts, key=lambda r: (starts[r], r))
        late = self.launches[straggler]
        transfer = late.end_us - late.start_us if late.end_us is not None else None
        from autoannot.traces.summary import bus_factor

        busbw = None
        if transfer and transfer > 0 and self.size_bytes:
            busbw = self.size_bytes / (transfer * 1e-6) / 1e9 * bus_factor(
                self.collective, len(self.launches))
        return {
            "group": self.group, "group_desc": next(iter(self.launches.values())).group_desc,
            "seq": self.seq, "collective": self.collective, "size_bytes": self.size_bytes,
            "straggler": straggler if skew >= IN_STEP_US else None,
            "skew_us": round(skew, 3),
            "transfer_us": None if transfer is None else round(transfer, 3),
            "busbw_gbps": None if busbw is None else round(busbw, 3),
            "ranks": {str(r): {"start_us": round(launch.start_us, 3),
                               "wait_us": round(last - launch.start_us, 3),
                               "call_site": launch.call_site}
                      for r, launch in sorted(self.launches.items())},
        }


@dataclass
class ClockFit:
    rank: int
    offset_us: float  # this rank's clock minus the reference rank's
    spread_us: float  # median absolute deviation of the per-instance estimates
    instances: int
    applied: bool


@dataclass
class Analysis:
    instances: list[Instance]
    clocks: list[ClockFit]
    problems: list[str] = field(default_factory=list)  # what could not be matched, and why
    ranks: list[int] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        return [instance.row() for instance in self.instances]

    def per_rank(self) -> list[dict[str, Any]]:
        """Per rank: time waiting in collectives, and time the others waited for it."""
        waited: dict[int, float] = defaultdict(float)
        caused: dict[int, float] = defaultdict(float)
        late: dict[int, int] = defaultdict(int)
        for row in self.rows():
            for rank, part in row["ranks"].items():
                waited[int(rank)] += part["wait_us"]
            if row["straggler"] is not None:
                caused[row["straggler"]] += sum(p["wait_us"] for p in row["ranks"].values())
                late[row["straggler"]] += 1
        return [{"rank": r, "waited_us": round(waited[r], 3),
                 "others_waited_for_it_us": round(caused[r], 3), "last_to_arrive": late[r]}
                for r in self.ranks]


# --- reading -----------------------------------------------------------------------------------

def trace_launches(path: Path) -> tuple[int | None, list[Launch], list[tuple[str, float, float]]]:
    """A trace's rank, its NCCL launches with collective args, and its gloo ranges
    (name, start, end) in start order."""
    from autoannot.traces.annotate import kernel_family
    from autoannot.traces.summary import DTYPE_BYTES

    trace = files.Trace(path)
    rank = trace.metadata().get("distributedInfo", {}).get("rank")
    rank = rank if isinstance(rank, int) else None
    kernels: list[tuple[float, float, dict[str, Any]]] = []
    gloo: list[tuple[str, float, float]] = []
    events = (trace.document["traceEvents"] if trace.document is not None
              else (json.loads("{" + chunk + "}") for chunk in trace._chunks()
                    if "nccl" in chunk or '"gloo:' in chunk))
    for event in events:
        if not isinstance(event, dict):
            continue
        cat, name = event.get("cat"), str(event.get("name", ""))
        ts, dur = float(event.get("ts", 0)), float(event.get("dur", 0))
        if cat == "user_annotation" and name.startswith("gloo:"):
            gloo.append((name[len("gloo:"):], ts, ts + dur))
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
            group_desc=str(args.get(V.PG_DESC, ""))))
    return rank, launches, gloo


def record_launches(path: Path) -> tuple[int | None, list[Launch]]:
    """A record file's rank and launches (entry times, call sites)."""
    from autoannot.traces.summary import DTYPE_BYTES

    launches: list[Launch] = []
    rank: int | None = None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise files.TraceError(f"{path}: cannot read: {exc.strerror}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            annotation = entry["annotation"]
            if "seq" not in entry:
                raise KeyError("seq")
        except (ValueError, KeyError, TypeError) as exc:
            raise files.TraceError(
                f"{path}:{number}: not a line of an AUTOANNOT_RECORD file ({exc}); files "
                "written before autoannot 0.1 (no seq) cannot be lined up across ranks") from None
        if entry.get("rank") is not None:
            rank = int(entry["rank"])
        if V.COLLECTIVE_NAME not in annotation:
            continue  # point-to-point blocks: no collective instance
        dtype = str(annotation.get(V.DTYPE, "?"))
        nelems = max(int(annotation.get(V.IN_NELEMS, 0)), int(annotation.get(V.OUT_NELEMS, 0)))
        launches.append(Launch(
            rank if rank is not None else -1, str(entry["group"]), int(entry["seq"]),
            str(annotation[V.COLLECTIVE_NAME]), nelems * DTYPE_BYTES.get(dtype, 0),
            int(annotation.get(V.GROUP_SIZE, 1)), entry["monotonic_ns"] / 1e3, None,
            entry.get("call_site"), str(annotation.get(V.PG_DESC, ""))))
    return rank, launches


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


def join(rank: int, traced: list[Launch], gloo: list[tuple[str, float, float]],
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
                for (_, start, end), r in zip(gloo, recorded[offset:], strict=False)]
    return recorded


def _gloo_alignment(gloo: list[tuple[str, float, float]], records: list[Launch]) -> int | None:
    """Where the trace's gloo ranges start in the record file (the profiler saw a window of
    the run): the stretch whose collectives fit the ranges' names and whose entry times keep
    the steadiest distance to the ranges' starts (two clocks, one host: a range starts soon
    after its launch is entered). None where no stretch fits, or two fit alike."""
    fits = []
    for offset in range(len(records) - len(gloo) + 1):
        window = records[offset:offset + len(gloo)]
        if all(_fits_gloo(name, r.collective) for (name, _, _), r in zip(gloo, window,
                                                                         strict=True)):
            gaps = [start - r.start_us for (_, start, _), r in zip(gloo, window, strict=True)]
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

def analyze(per_rank: dict[int, list[Launch]]) -> Analysis:
    """Instances across ranks, clocks fitted, from each rank's launches."""
    problems: list[str] = []
    table: dict[tuple[str, int], dict[int, Launch]] = defaultdict(dict)
    for rank, launches in per_rank.items():
        for launch in launches:
            launch.rank = rank
            table[(launch.group, launch.seq)][rank] = launch
    instances: list[Instance] = []
    for (group, seq), launches in sorted(table.items(), key=lambda item: (item[0][0],
                                                                             item[0][1])):
        kinds = {(launch.collective, launch.size_bytes) for launch in launches.values()}
        if {kind[0] for kind in kinds} == {"send", "recv"} and len({k[1] for k in kinds}) == 1:
            kinds = {("send/recv", next(iter(kinds))[1])}  # a point-to-point pair
        size = max(launch.group_size for launch in launches.values())
        if len(kinds) > 1:
            what = "; ".join(f"rank {r}: {launch.collective} {launch.size_bytes} B"
                             for r, launch in sorted(launches.items()))
            problems.append(f"group {group}, collective #{seq}: the ranks disagree ({what}): "
                            "not matched")
            continue
        if len(launches) < size:
            missing = size - len(launches)
            if len(launches) > 1 or size > 1:
                problems.append(f"group {group}, collective #{seq}: {missing} of its {size} "
                                "ranks have no trace or record of it: left out")
            continue
        collective, size_bytes = kinds.pop()
        instances.append(Instance(group, seq, collective, size_bytes, dict(launches)))
    clocks = _fit_clocks(instances, sorted(per_rank))
    for fit in clocks:
        if fit.applied:
            for instance in instances:
                launch = instance.launches.get(fit.rank)
                if launch is not None:
                    launch.start_us -= fit.offset_us
                    if launch.end_us is not None:
                        launch.end_us -= fit.offset_us
    return Analysis(instances, clocks, problems, sorted(per_rank))


def _fit_clocks(instances: list[Instance], ranks: list[int]) -> list[ClockFit]:
    """Each rank's clock offset from the first rank's, from the instances' end times."""
    if not ranks:
        return []
    reference = ranks[0]
    fits = [ClockFit(reference, 0.0, 0.0, 0, False)]
    for rank in ranks[1:]:
        estimates = [i.launches[rank].end_us - i.launches[reference].end_us
                     for i in instances
                     if rank in i.launches and reference in i.launches
                     and i.launches[rank].end_us is not None
                     and i.launches[reference].end_us is not None]
        if not estimates:
            fits.append(ClockFit(rank, 0.0, 0.0, 0, False))
            continue
        offset = statistics.median(estimates)
        spread = statistics.median(abs(e - offset) for e in estimates)
        applied = abs(offset) > max(5.0, 3 * spread)
        fits.append(ClockFit(rank, offset, spread, len(estimates), applied))
    return fits


def analyze_files(traces: Iterable[Path], records: Iterable[Path]) -> Analysis:
    """Read every trace and record file, join them per rank, and match instances."""
    problems: list[str] = []
    traced: dict[int, tuple[list[Launch], list[tuple[str, float, float]], Path]] = {}
    for position, path in enumerate(traces):
        rank, launches, gloo = trace_launches(path)
        rank = position if rank is None else rank
        if rank in traced:
            raise files.TraceError(f"{traced[rank][2]} and {path} are both rank {rank}'s "
                                   "trace: give one trace per rank of one job")
        traced[rank] = (launches, gloo, path)
    recorded: dict[int, tuple[list[Launch], Path]] = {}
    for path in records:
        rank, launches = record_launches(path)
        if rank is None:
            raise files.TraceError(f"{path}: names no rank (written before the process group "
                                   "was up, with no RANK set): cannot place it")
        if rank in recorded:
            raise files.TraceError(f"{recorded[rank][1]} and {path} are both rank {rank}'s "
                                   "record file")
        recorded[rank] = (launches, path)
    per_rank: dict[int, list[Launch]] = {}
    for rank in sorted(set(traced) | set(recorded)):
        launches, gloo, path = traced.get(rank, ([], [], None))
        records, record_path = recorded.get(rank, ([], None))
        where = str(path or record_path)
        per_rank[rank] = join(rank, launches, gloo, records, problems, where)
        if not per_rank[rank]:
            problems.append(f"{where}: no collective to line up (eager NCCL kernels with "
                            "collective args, annotated graphed ones, or a record file)")
    analysis = analyze(per_rank)
    analysis.problems[:0] = problems
    return analysis


# --- text ----------------------------------------------------------------------------------------

def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e3:.2f} ms" if value >= 1e4 else f"{value:.1f} us"


def format_report(analysis: Analysis, top: int = 10) -> str:
    rows = analysis.rows()
    lines = [f"{len(rows)} collective instances on {len(analysis.ranks)} ranks", "",
             f"{'rank':>4} {'waited in collectives':>22} {'others waited for it':>21} "
             f"{'last to arrive':>15}"]
    for r in analysis.per_rank():
        lines.append(f"{r['rank']:>4} {_us(r['waited_us']):>22} "
                     f"{_us(r['others_waited_for_it_us']):>21} {r['last_to_arrive']:>15}")
    lines += ["", f"top {min(top, len(rows))} instances by skew:",
              f"{'group':14} {'#':>5} {'collective':24} {'size':>10} {'last':>5} {'skew':>10} "
              f"{'transfer':>10}  call site (the last rank's)"]
    from autoannot.traces.summary import _size

    for row in sorted(rows, key=lambda r: -r["skew_us"])[:top]:
        straggler = row["straggler"]
        site = row["ranks"][str(straggler)]["call_site"] if straggler is not None else None
        group = f"{row['group_desc'] or '?'} ({row['group']})"
        lines.append(f"{group[:14]:14} {row['seq']:>5} {row['collective'][:24]:24} "
                     f"{_size(row['size_bytes']):>10} "
                     f"{'-' if straggler is None else straggler:>5} {_us(row['skew_us']):>10} "
                     f"{_us(row['transfer_us']):>10}  {site or '-'}")
    fitted = [c for c in analysis.clocks if c.instances]
    if fitted:
        lines += ["", "clocks (each rank's offset from rank "
                  f"{analysis.clocks[0].rank}'s, fitted on the instances' end times):"]
        for c in fitted:
            lines.append(f"  rank {c.rank}: {c.offset_us:+.1f} us, spread {c.spread_us:.1f} us "
                         f"over {c.instances} instances: "
                         + ("taken out" if c.applied else "within its spread: left as is"))
    for problem in analysis.problems:
        lines.append(f"note: {problem}")
    return "\n".join(lines)


CSV_FIELDS = ("group", "group_desc", "seq", "collective", "size_bytes", "straggler", "skew_us",
              "transfer_us", "busbw_gbps", "rank", "start_us", "wait_us", "call_site")


def csv_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One CSV row per instance and rank."""
    flat = []
    for row in rows:
        for rank, part in row["ranks"].items():
            flat.append({**{k: row[k] for k in CSV_FIELDS[:9]}, "rank": int(rank), **part})
    return flat

"""``autoannot summary``: what each process group moved, and how fast, across ranks.

Reads the NCCL kernels that carry collective args (eager traces, and graphed traces after
``autoannot annotate``) and groups them by (process group, collective, dtype, size). Bandwidth
follows nccl-tests: algbw = size / time, busbw = algbw x factor, with factor 2(n-1)/n for
all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for broadcast and reduce;
size is the larger of the input and output messages, in bytes.

The time is the *transfer*: an NCCL kernel starts when its rank arrives and ends when the
transfer is done, so its duration is mostly waiting for the last rank. Where the traces of a
group's ranks line up (``skew.py``: each collective on every member rank), the time of one
collective is the last rank's kernel (from the last arrival to the end), as nccl-tests time a
collective after a barrier; and the rank that arrived last most often is named with the time
the others spent waiting for it. Where they do not (one rank's trace), the kernel time is used
and the row says so.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoannot.describe import vocabulary as V
from autoannot.traces import files, names
from autoannot.traces.paths import DEFAULT_FOLDER
from autoannot.traces.read.rank_files import group_ranks
from autoannot.traces.units import DTYPE_BYTES, bus_factor
from autoannot.traces.units import size_text as _size


@dataclass(frozen=True)
class Key:
    group: str  # "description (name)"
    collective: str
    dtype: str
    size_bytes: int
    ranks: int
    name: str = ""  # the process group's name alone


@dataclass
class Row:
    key: Key
    count: dict[int, int]  # rank -> calls
    total_us: dict[int, float]  # rank -> total kernel time
    median_us: dict[int, float]  # rank -> median kernel time
    instances: list[dict[str, Any]] = field(default_factory=list)  # skew.py's rows, this key's

    def as_dict(self) -> dict[str, Any]:
        key = self.key
        ranks = sorted(self.total_us)
        medians = [self.median_us[r] for r in ranks]
        transfers = [i["transfer_us"] for i in self.instances if i["transfer_us"]]
        typical = statistics.median(transfers) if transfers else statistics.median(medians)
        algbw = key.size_bytes / (typical * 1e-6) / 1e9 if typical > 0 else 0.0
        held_up_by, held_up_us = _held_up(self.instances)
        return {
            "group": key.group, "collective": key.collective, "dtype": key.dtype,
            "size_bytes": key.size_bytes, "group_size": key.ranks,
            "count_min": min(self.count.values()), "count_max": max(self.count.values()),
            "total_bytes_per_rank": key.size_bytes * max(self.count.values()),
            "total_us_min": min(self.total_us.values()),
            "total_us_median": statistics.median(self.total_us.values()),
            "total_us_max": max(self.total_us.values()),
            "median_us_min": min(medians), "median_us_median": statistics.median(medians),
            "median_us_max": max(medians),
            "time_us": typical,  # what the bandwidths are computed from (see time_from)
            "time_from": ("transfer (the last rank's kernel)" if transfers
                          else "kernel time (waiting included)"),
            "transfer_us_median": statistics.median(transfers) if transfers else None,
            "skew_us_median": (statistics.median(i["skew_us"] for i in self.instances)
                               if self.instances else None),
            "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(key.collective, key.ranks),
            "held_up_by": held_up_by, "held_up_us": held_up_us, "ranks": len(ranks),
        }


#: Below this, the others' waiting on the rank that arrived last is not shown as a hold-up
#: (the table rounds to 0.01 ms: "rank 0 (0.00 ms)" said nothing).
HELD_UP_SHOWN_US = 10.0


def _fit(group: str, width: int) -> str:
    """A group's "description (name)" in ``width`` characters: the description shortened,
    never the name in parentheses."""
    if len(group) <= width:
        return group
    head, sep, name = group.rpartition(" (")
    if not sep or len(name) + 2 > width - 2:
        return group[: width - 1] + "~"
    room = width - len(name) - 3
    return f"{head[:room]}~ ({name}"


def _held_up(instances: list[dict[str, Any]]) -> tuple[int | None, float | None]:
    """The rank that arrived last most often, and the time the others spent waiting in the
    instances it arrived last; (None, None) without instances or stragglers."""
    if not instances:
        return None, None
    counts: dict[int, int] = defaultdict(int)
    for instance in instances:
        if instance["straggler"] is not None:
            counts[instance["straggler"]] += 1
    if not counts:
        return None, 0.0
    rank = max(counts, key=lambda r: (counts[r], -r))
    waited = sum(p["wait_us"] for i in instances if i["straggler"] == rank
                 for p in i["ranks"].values())
    return rank, round(waited, 3)


@dataclass
class TraceContents:
    """What one trace holds, as far as the summary is concerned."""

    path: Path
    rank: int | None  # distributedInfo's rank; None where the trace names none
    durations: dict[Key, list[float]]  # the NCCL kernels with collective args, by key
    unannotated: int  # NCCL kernels without collective args (graphed, not annotated yet)
    gloo: dict[str, list[float]]  # gloo's profiler ranges ("gloo:all_reduce"): their times


def _events(trace: files.Trace, progress: bool) -> Iterable[dict[str, Any]]:
    """The events the summary reads (collective kernels, NCCL kernels, gloo ranges),
    streamed."""
    if trace.document is not None:
        yield from (e for e in trace.document["traceEvents"] if isinstance(e, dict))
        return
    for chunk in _chunks_with_progress(trace, progress):
        yield json.loads("{" + chunk + "}")


def _chunks_with_progress(trace: files.Trace, progress: bool) -> Iterable[str]:
    """The chunks the summary reads (a long read shows its bar: ``progress.Progress``)."""
    from autoannot.traces.read.annotate import may_name_a_collective_kernel

    for block in trace._blocks():
        for chunk in block:
            if may_name_a_collective_kernel(chunk) or '"gloo:' in chunk:
                yield chunk


def read_trace(job: tuple[Path, bool]) -> TraceContents:
    """One trace's collective kernel times by key, its rank and the rest the summary reports
    (``job``: the path, whether to draw a progress bar)."""
    from autoannot.traces.read.annotate import kernel_family

    path, bar = job
    trace = files.Trace(path)
    rank = trace.metadata().get("distributedInfo", {}).get("rank")
    contents = TraceContents(path, rank if isinstance(rank, int) else None, defaultdict(list),
                             0, defaultdict(list))
    for event in _events(trace, bar):
        cat, name = event.get("cat"), str(event.get("name", ""))
        if cat == "user_annotation" and name.startswith("gloo:"):
            contents.gloo[name[len("gloo:"):]].append(float(event.get("dur", 0)))
            continue
        if cat != "kernel" or not kernel_family(name):
            continue
        args = event.get("args") or {}
        if V.COLLECTIVE_NAME not in args:
            contents.unannotated += 1
            continue
        collective = args[V.COLLECTIVE_NAME]
        nelems = max(int(args.get(V.IN_NELEMS, 0)), int(args.get(V.OUT_NELEMS, 0)))
        dtype = str(args.get(V.DTYPE, "?"))
        group = names.group_column(str(args.get(V.PG_NAME, "?")), args.get(V.PG_DESC),
                                   group_ranks(args))
        key = Key(group, collective, dtype, nelems * DTYPE_BYTES.get(dtype, 0),
                  int(args.get(V.GROUP_SIZE, 1)), str(args.get(V.PG_NAME, "?")))
        contents.durations[key].append(float(event.get("dur", 0)))
    contents.durations = dict(contents.durations)
    contents.gloo = dict(contents.gloo)
    return contents


@dataclass
class Summary:
    rows: list[dict[str, Any]]  # one per (group, collective, dtype, size): NCCL kernels
    cpu_rows: list[dict[str, Any]]  # one per gloo collective: counts and time, no sizes
    notes: list[str]  # what the user should know about the inputs
    #: One per (group, collective, dtype, size) of record files: counts, no time.
    record_rows: list[dict[str, Any]] = field(default_factory=list)
    #: One per (group, collective, size) of rows files (``table.rows``): instances, the median
    #: transfer and bus bandwidth (``report.group_rows``).
    instance_rows: list[dict[str, Any]] = field(default_factory=list)


def record_rows(paths: list[Path], run: str | None = None) -> list[dict[str, Any]]:
    """Record files (``AUTOANNOT_RECORD``, one per rank) as rows: what each group launched,
    its sizes and how often — any backend, gloo's too — in one run of the job (``run``, or the
    only one: TraceError naming them where the files hold several). No times: a record line
    is written when its launch is entered."""
    from autoannot.traces.read import record_files, runs

    lines: dict[Path, list[dict[str, Any]]] = {}
    found: dict[str, list[Path]] = {}
    for path in paths:
        entries = [e for e in record_files.read(path).lines if record_files.is_collective(e)]
        lines[path] = entries
        for name in dict.fromkeys(runs.run_of(entry) for entry in entries):
            found.setdefault(name, []).append(path)
    chosen = runs.choose(found, run)
    counts: dict[tuple[str, str, str, int, int], dict[int, int]] = defaultdict(
        lambda: defaultdict(int))
    for position, entries in enumerate(lines.values()):
        for entry in entries:
            if runs.run_of(entry) != chosen:
                continue
            a = entry["annotation"]
            rank = entry.get("rank")
            rank = rank if isinstance(rank, int) else position
            dtype, _, size = record_files.size_of(a)
            group = names.group_column(str(entry.get("group", a.get(V.PG_NAME, "?"))),
                                       a.get(V.PG_DESC), group_ranks(a))
            key = (group, str(a[V.COLLECTIVE_NAME]), dtype, size, int(a.get(V.GROUP_SIZE, 1)))
            counts[key][rank] += 1
    rows = []
    for (group, collective, dtype, size, group_size), per_rank in sorted(counts.items()):
        rows.append({"group": group, "collective": collective, "dtype": dtype,
                     "size_bytes": size, "group_size": group_size,
                     "count_min": min(per_rank.values()), "count_max": max(per_rank.values()),
                     "ranks": len(per_rank),
                     "total_bytes_per_rank": size * max(per_rank.values()), "run": chosen})
    return rows


def _counts(row: dict[str, Any]) -> str:
    """A row's calls per rank: ``"3"``, or ``"2-3"`` where the ranks differ."""
    low, high = row["count_min"], row["count_max"]
    return str(high) if low == high else f"{low}-{high}"


def format_record_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'group':22} {'collective':32} {'dtype':9} {'size':>10} {'count':>7} "
             f"{'ranks':>5}   (record files: counts, no times)"]
    for r in rows:
        count = _counts(r)
        lines.append(f"{_fit(r['group'], 22):22} {r['collective'][:32]:32} {r['dtype']:9} "
                     f"{_size(r['size_bytes']):>10} {count:>7} {r['ranks']:>5}")
    return "\n".join(lines)


def format_instance_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'group':22} {'collective':32} {'size':>10} {'instances':>9} {'ranks':>5} "
             f"{'median transfer':>15} {'busbw GB/s':>10}   (rows: the last rank's transfer)"]
    for r in rows:
        group = names.group_column(r["group"], r["group_desc"])
        transfer = r["median_transfer_us"]
        busbw = r["median_busbw_gbps"]
        lines.append(f"{_fit(group, 22):22} {r['collective'][:32]:32} "
                     f"{_size(r['size_bytes']):>10} {r['instances']:>9} {r['ranks']:>5} "
                     f"{'-' if transfer is None else f'{transfer:.1f} us':>15} "
                     f"{'-' if busbw is None else f'{busbw:.2f}':>10}")
    return "\n".join(lines)


def assign_ranks(traces: list[tuple[Path, int | None]]) -> list[int]:
    """Each trace's rank (``traces``: path, the rank it names): the one it names, else (where
    none names one) its place in the list. Two traces of one rank raise TraceError: adding
    them up would double every count."""
    named = [rank for _, rank in traces]
    if all(r is None for r in named):
        return list(range(len(traces)))
    nameless = [path for path, rank in traces if rank is None]
    if nameless:
        raise files.TraceError(f"{nameless[0]}: names no rank (no distributedInfo) while other "
                               "traces do: give one trace per rank of one job")
    first: dict[int, Path] = {}
    for path, rank in traces:
        assert rank is not None
        if rank in first:
            other = first[rank]
            why = "give one trace per rank of one job"
            for copy, source in ((path, other), (other, path)):
                marker = files.annotated_from(copy)
                if marker is not None and marker.get("from") == source.name:
                    why = f"{copy} is autoannot's annotated copy of {source}: give one of them"
            raise files.TraceError(f"{other} and {path} are both rank {rank}'s trace: {why}")
        first[rank] = path
    return [r for r in named if r is not None]


def summarize(paths: list[Path], progress: bool = True, jobs: int | None = None) -> Summary:
    """One row per (group, collective, dtype, size), over all ranks' traces (read on ``jobs``
    processes, default: the cores; the rows do not depend on it)."""
    from autoannot.traces import parallel

    bar = progress and len(paths) == 1  # one file: its own bar; several: a line per file
    contents = list(parallel.map_files(read_trace, [(p, bar) for p in paths], jobs, "read",
                                       name=lambda job: job[0], show=progress))
    ranks = assign_ranks([(c.path, c.rank) for c in contents])
    durations: dict[Key, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    gloo: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    notes = []
    for rank, c in zip(ranks, contents, strict=True):
        for key, times in c.durations.items():
            durations[key][rank].extend(times)
        for name, times in c.gloo.items():
            gloo[name][rank].extend(times)
        if c.unannotated:
            annotated = c.path.parent / DEFAULT_FOLDER / c.path.name
            notes.append(f"{c.path}: {c.unannotated} NCCL kernels carry no collective args "
                         f"(graphed, not annotated): left out; run autoannot annotate {c.path}, "
                         f"then autoannot summary {annotated}")
    if all(c.rank is None for c in contents) and len(contents) > 1:
        notes.append("the traces name no rank: ranks taken in the order given")
    instances = _instances(paths, durations, notes)
    rows = []
    for key, per_rank in durations.items():
        row = Row(key, {r: len(d) for r, d in per_rank.items()},
                  {r: sum(d) for r, d in per_rank.items()},
                  {r: statistics.median(d) for r, d in per_rank.items()},
                  instances.get((key.name, key.collective, key.size_bytes), []))
        rows.append(row.as_dict())
    rows.sort(key=lambda r: (r["group"], -r["total_us_median"]))
    cpu_rows = []
    for name, per_rank in sorted(gloo.items()):
        counts = [len(t) for t in per_rank.values()]
        totals = [sum(t) for t in per_rank.values()]
        cpu_rows.append({"backend": "gloo", "collective": name, "count_min": min(counts),
                         "count_max": max(counts), "ranks": len(per_rank),
                         "total_us_median": statistics.median(totals)})
    if cpu_rows:
        notes.append("gloo collectives: counts and time in gloo's profiler ranges (waiting "
                     "included); a gloo trace holds no sizes or groups: record them with "
                     "AUTOANNOT=1 AUTOANNOT_RECORD=FILE")
    if not rows and not cpu_rows:
        notes.append("no collectives in these traces (no NCCL kernel with collective args, no "
                     "gloo collective)")
    return Summary(rows, cpu_rows, notes)


def _instances(paths: list[Path], durations: dict[Key, Any], notes: list[str]
               ) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    """skew.py's instances by (group name, collective, size), where several ranks' traces hold
    NCCL collectives; else none."""
    from autoannot.traces.analysis import lineup

    if len(paths) < 2 or not durations:
        if durations:
            notes.append("one trace: times are kernel times, waiting for the other ranks "
                         "included (give every rank's trace for transfer times)")
        return {}
    analysis = lineup.analyze_files(paths, [])
    found: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for row in analysis.rows():
        found[(row["group"], row["collective"], row["size_bytes"])].append(row)
    if analysis.problems:
        notes.append(f"{len(analysis.problems)} collectives could not be lined up across "
                     "ranks (autoannot skew lists them): their rows use kernel times")
    return dict(found)


def format_table(rows: list[dict[str, Any]]) -> str:
    header = (f"{'group':22} {'collective':32} {'dtype':9} {'size':>10} {'count':>7} "
              f"{'transfer us':>11} {'skew us':>9} {'algbw GB/s':>10} {'busbw GB/s':>10} "
              f"{'held up by':>20}")
    lines = [header]
    for r in rows:
        count = _counts(r)
        transfer = r["transfer_us_median"]
        time = f"{transfer:.1f}" if transfer is not None else f"{r['time_us']:.1f}*"
        skew = "-" if r["skew_us_median"] is None else f"{r['skew_us_median']:.1f}"
        held = ("-" if r["held_up_by"] is None or (r["held_up_us"] or 0) < HELD_UP_SHOWN_US
                else f"rank {r['held_up_by']} ({r['held_up_us'] / 1e3:.2f} ms)")
        lines.append(
            f"{_fit(r['group'], 22):22} {r['collective'][:32]:32} {r['dtype']:9} "
            f"{_size(r['size_bytes']):>10} {count:>7} {time:>11} {skew:>9} "
            f"{r['algbw_gbps']:10.2f} {r['busbw_gbps']:10.2f} {held:>20}")
    if any(r["transfer_us_median"] is None for r in rows):
        lines.append("* kernel time, waiting for the other ranks included: the bandwidth is a "
                     "lower bound")
    return "\n".join(lines)


def format_cpu_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'backend':8} {'collective':32} {'count':>7} {'ranks':>5} {'total us':>10}"]
    for r in rows:
        count = _counts(r)
        lines.append(f"{r['backend']:8} {r['collective'][:32]:32} {count:>7} {r['ranks']:>5} "
                     f"{r['total_us_median']:10.1f}")
    return "\n".join(lines)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    import csv
    import io

    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    files.atomic_write_text(str(path), buffer.getvalue())

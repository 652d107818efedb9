"""``autoannot summary``: what each process group moved, and how fast, across ranks.

Reads the NCCL kernels that carry collective args (eager traces, and graphed traces after
``autoannot annotate``) and groups them by (process group, collective, dtype, size). Bandwidth
follows nccl-tests: algbw = size / time, busbw = algbw x factor, with factor 2(n-1)/n for
all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for broadcast and reduce;
size is the larger of the input and output messages, in bytes.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoannot import vocabulary as V
from autoannot.traces import files

#: Bytes per element of c10 ScalarType names.
DTYPE_BYTES = {
    "Bool": 1, "Byte": 1, "Char": 1, "Short": 2, "Int": 4, "Long": 8, "Half": 2, "Float": 4,
    "Double": 8, "BFloat16": 2, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16,
    "UInt16": 2, "UInt32": 4, "UInt64": 8, "Float8_e5m2": 1, "Float8_e4m3fn": 1,
    "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1, "Float8_e8m0fnu": 1,
}

#: "Collective name" -> the nccl-tests bus-bandwidth family.
_FAMILY = {
    "allreduce": "allreduce", "allreduce_coalesced": "allreduce", "barrier": "allreduce",
    "all_gather": "allgather", "_allgather_base": "allgather",
    "allgather_into_tensor_coalesced": "allgather", "reduce_scatter": "reducescatter",
    "_reduce_scatter_base": "reducescatter", "reduce_scatter_tensor_coalesced": "reducescatter",
    "all_to_all": "alltoall", "all_to_allv": "alltoall", "broadcast": "broadcast",
    "reduce": "reduce",
}


def bus_factor(collective: str, ranks: int) -> float:
    family = _FAMILY.get(collective)
    if ranks <= 1 or family is None:
        return 1.0
    if family == "allreduce":
        return 2 * (ranks - 1) / ranks
    if family in ("allgather", "reducescatter", "alltoall"):
        return (ranks - 1) / ranks
    return 1.0


@dataclass(frozen=True)
class Key:
    group: str
    collective: str
    dtype: str
    size_bytes: int
    ranks: int


@dataclass
class Row:
    key: Key
    count: dict[int, int]  # rank -> calls
    total_us: dict[int, float]  # rank -> total kernel time
    median_us: dict[int, float]  # rank -> median kernel time

    def as_dict(self) -> dict[str, Any]:
        key = self.key
        ranks = sorted(self.total_us)
        medians = [self.median_us[r] for r in ranks]
        typical = statistics.median(medians)
        algbw = key.size_bytes / (typical * 1e-6) / 1e9 if typical > 0 else 0.0
        slowest = max(ranks, key=lambda r: self.total_us[r])
        return {
            "group": key.group, "collective": key.collective, "dtype": key.dtype,
            "size_bytes": key.size_bytes, "group_size": key.ranks,
            "count_min": min(self.count.values()), "count_max": max(self.count.values()),
            "bytes_per_rank": key.size_bytes * max(self.count.values()),
            "total_us_min": min(self.total_us.values()),
            "total_us_median": statistics.median(self.total_us.values()),
            "total_us_max": max(self.total_us.values()),
            "median_us_min": min(medians), "median_us_median": typical,
            "median_us_max": max(medians),
            "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(key.collective, key.ranks),
            "slowest_rank": slowest, "ranks": len(ranks),
        }


def _kernels(path: Path, progress: bool) -> Iterable[dict[str, Any]]:
    """The NCCL kernels with collective args, streamed."""
    trace = files.Trace(path)
    if trace.document is not None:
        events: Iterable[Any] = trace.document["traceEvents"]
    else:
        events = (json.loads("{" + c + "}") for c in _chunks_with_progress(trace, progress))
    for event in events:
        if isinstance(event, dict) and event.get("cat") == "kernel" and (
                V.COLLECTIVE_NAME in event.get("args", {})):
            yield event


def _chunks_with_progress(trace: files.Trace, progress: bool) -> Iterable[str]:
    started, total, done, shown = time.monotonic(), max(1, trace.path.stat().st_size), 0, False
    for block in trace._blocks():
        done += sum(len(c) for c in block)
        if progress and time.monotonic() - started > 1.0:
            _bar(trace.path.name, min(done / total, 1.0))
            shown = True
        for chunk in block:
            if '"Collective name"' in chunk:
                yield chunk
    if shown:
        _bar(trace.path.name, 1.0)
        print(file=sys.stderr)


def _bar(name: str, fraction: float) -> None:
    filled = int(fraction * 30)
    print(f"\r{name[:40]:40} [{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%}",
          end="", file=sys.stderr, flush=True)


def _rank_of(path: Path, fallback: int) -> int:
    trace = files.Trace(path)
    rank = trace.metadata().get("distributedInfo", {}).get("rank")
    return rank if isinstance(rank, int) else fallback


def file_durations(job: tuple[Path, int, bool]) -> tuple[int, dict[Key, list[float]]]:
    """One trace's collective kernel times by key, and its rank (``job``: the path, its place
    in the list as the rank where the trace names none, whether to draw a progress bar)."""
    path, position, bar = job
    per_key: dict[Key, list[float]] = defaultdict(list)
    for kernel in _kernels(path, bar):
        args = kernel["args"]
        name = args[V.COLLECTIVE_NAME]
        nelems = max(int(args.get(V.IN_NELEMS, 0)), int(args.get(V.OUT_NELEMS, 0)))
        dtype = str(args.get(V.DTYPE, "?"))
        group = f"{args.get(V.PG_DESC, '?')} ({args.get(V.PG_NAME, '?')})"
        key = Key(group, name, dtype, nelems * DTYPE_BYTES.get(dtype, 0),
                  int(args.get(V.GROUP_SIZE, 1)))
        per_key[key].append(float(kernel.get("dur", 0)))
    return _rank_of(path, position), dict(per_key)


def summarize(paths: list[Path], progress: bool = True, jobs: int | None = None
              ) -> list[dict[str, Any]]:
    """One row per (group, collective, dtype, size), over all ranks' traces (read on ``jobs``
    processes, default: the cores; the rows do not depend on it)."""
    from autoannot.traces import parallel

    durations: dict[Key, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    bar = progress and len(paths) == 1  # one file: its own bar; several: a line per file
    jobs_list = [(path, n, bar) for n, path in enumerate(paths)]
    for rank, per_key in parallel.map_files(file_durations, jobs_list, jobs, "read",
                                            name=lambda job: job[0], show=progress):
        for key, times in per_key.items():
            durations[key][rank].extend(times)
    rows = []
    for key, per_rank in durations.items():
        row = Row(key, {r: len(d) for r, d in per_rank.items()},
                  {r: sum(d) for r, d in per_rank.items()},
                  {r: statistics.median(d) for r, d in per_rank.items()})
        rows.append(row.as_dict())
    rows.sort(key=lambda r: (r["group"], -r["total_us_median"]))
    return rows


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def format_table(rows: list[dict[str, Any]]) -> str:
    header = (f"{'group':22} {'collective':32} {'dtype':9} {'size':>10} {'count':>7} "
              f"{'total us':>10} {'median us (min/med/max)':>26} {'algbw GB/s':>10} "
              f"{'busbw GB/s':>10} {'slowest':>7}")
    lines = [header]
    for r in rows:
        count = (str(r["count_max"]) if r["count_min"] == r["count_max"]
                 else f"{r['count_min']}-{r['count_max']}")
        medians = f"{r['median_us_min']:.1f}/{r['median_us_median']:.1f}/{r['median_us_max']:.1f}"
        lines.append(
            f"{r['group'][:22]:22} {r['collective'][:32]:32} {r['dtype']:9} "
            f"{_size(r['size_bytes']):>10} {count:>7} {r['total_us_median']:10.1f} "
            f"{medians:>26} {r['algbw_gbps']:10.2f} {r['busbw_gbps']:10.2f} "
            f"{'rank ' + str(r['slowest_rank']):>7}")
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

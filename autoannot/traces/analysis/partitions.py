"""The analysis cut into partitions that an engine schedules (``engines``): the functions here
are the whole matcher, run by every path, whether its rows fit in memory (one partition) or
not (many, read one at a time or on a cluster's workers).

A *partition* is a range of instance keys (group, seq): small groups together, a large
group's sequence in stretches, each about ``TARGET_LAUNCHES`` launches. An instance never
spans two partitions, and partitions in order are instances in (group, seq) order, so the
answers do not depend on how many there are. A partition's rows in a rank's rows file lie in
one range of rows (rows are in time order and a group's sequence runs forward in time), read
with one ``pread`` a column. Passes, each a map over partitions or sources and a reduction of
small results:

1. Per rank (``spoilt_by``, then ``index_source``), in tasks of many ranks: the first
   rank's instances this rank spoils for the clock fit (it disagreed there, or ran off a GPU
   kernel); then, all of those known, each partition's row range in the rank's file and the
   rank's clock: the median of its kernels' ends less the first rank's over the instances both
   ran (found by key in the first rank's launches: no sort). Only three numbers a rank come
   back. The cut (``cut``) before: by the groups' extents, which rows heads say
   (``survey_source`` reads them where a head does not).
2. ``match_partition`` then ``figure_partition`` (per partition, clocks applied): launches
   sorted into instances, conflicts, the instances' facts; arrivals, straggler, skew,
   transfer, each launch's wait and per-rank sums, what the cause chains need, heat-map cells.
3. The driver (``passes``): cause chains and blame over all instances, per-rank figures.

Each launch's previous and next launch *on its rank* (the lateness a straggler carried in,
the bound on an entry-only wait) are the rows before and after it in its rank's file: known
to the partition with no other rank's data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from autoannot.traces import files
from autoannot.traces.analysis.results import IN_STEP_US

SEQ_BITS = 40  # an instance key is group << 40 | seq
#: Launches a partition holds at most, about (its working set: ~150 bytes a launch).
TARGET_LAUNCHES = 4_000_000
#: The columns a partition reads, and their numpy types in memory.
READ = ("group", "seq", "collective", "size_bytes", "start_us", "end_us", "site", "kernel",
        "step", "dtype")
_NUMPY = {"I": "<u4", "q": "<i8", "d": "<f8", "i": "<i4", "B": "u1"}


@dataclass(slots=True)
class Source:
    """One rank's rows: a rows file, read by row range (``path``: its columns, as the head
    lists them, from ``data_offset`` on), or rows in memory (``columns``, sorted by time);
    with its string codes onto the plan's. (Slotted and small: a plan holds one a rank.)"""

    rank: int
    count: int
    group_map: Any  # local group code -> the plan's
    collective_map: Any
    site_map: Any  # (with -1 at the end: local -1 stays -1)
    dtype_map: Any
    shift_us: float = 0.0  # onto the plan's epoch
    path: str | None = None
    kinds: tuple[tuple[str, str], ...] | None = None  # (column, numpy type), in file order
    data_offset: int = 0
    columns: dict[str, Any] | None = None
    origin: str = ""  # the file its rows were read from, where any (for messages)

    def read(self, lo: int, hi: int, names: tuple[str, ...] = READ) -> dict[str, Any]:
        """Rows ``lo`` to ``hi`` of the named columns (missing columns of version 1 files:
        step -1, dtype 0)."""
        import numpy as np

        if self.columns is not None:
            return {n: np.asarray(self.columns[n])[lo:hi] for n in names}
        assert self.path is not None and self.kinds is not None
        where: dict[str, tuple[int, str]] = {}
        at = self.data_offset
        for name, kind in self.kinds:
            where[name] = (at, kind)
            at += self.count * int(kind[-1])
        found: dict[str, Any] = {}
        with open(self.path, "rb") as handle:
            fd = handle.fileno()
            for name in names:
                if name not in where:
                    found[name] = (np.full(hi - lo, -1, np.int32) if name == "step"
                                   else np.zeros(hi - lo, np.uint32))
                    continue
                offset, kind = where[name]
                width = int(kind[-1])
                data = os.pread(fd, width * (hi - lo), offset + width * lo)
                if len(data) != width * (hi - lo):
                    raise files.TraceError(f"{self.path}: cut short while it was read")
                found[name] = np.frombuffer(data, dtype=kind)
        return found


_KINDS: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}


def kinds_of(columns: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """A rows file's columns as (name, numpy type): one shared tuple for every file of a
    layout."""
    kinds = tuple((str(name), _NUMPY[code]) for name, code in columns)
    return _KINDS.setdefault(kinds, kinds)


@dataclass
class Partitioning:
    """What every partition task needs: the sources, the names, and the partitions' bounds
    and row ranges. Small (a few MB at 65,536 ranks): shipped to every worker once."""

    sources: list[Source]
    ranks: list[int]
    group_keys: list[str]
    group_size: Any
    group_desc: list[str]
    group_members: list[tuple[int, ...] | None]
    collective_names: list[str]
    site_names: list[str]
    dtype_names: list[str]
    starts: Any = None  # each partition's first instance key: partition k is keys
    #                     starts[k] <= key < starts[k + 1]
    ranges: Any = None  # (sources, partitions, 2): row ranges
    partitions: int = 1

    shift: Any = None  # each column's clock offset, taken out (pass 4)
    reference: dict[str, Any] = field(default_factory=dict)  # the first rank's, by key
    spoilt: Any = None  # the reference's instances no clock is fitted on
    #: Per source: (group, launches, lowest seq, highest seq) of its groups (None: unknown
    #: until read: ``survey_source``).
    surveys: list[Any] = field(default_factory=list)
    heat: dict[str, Any] = field(default_factory=dict)  # how pass 4 keys its cells

    @property
    def width(self) -> int:
        return len(self.ranks)

    def launches(self) -> int:
        """The launches of every source."""
        return sum(source.count for source in self.sources)

    def all_files(self) -> bool:
        """Whether every source is a file (what another process or machine can read)."""
        return all(s.path is not None for s in self.sources)

    def part_of(self, group: Any, seq: Any) -> Any:
        """The partition of each (group, seq)."""
        import numpy as np

        if self.partitions == 1:
            return np.zeros(len(seq), np.int64)
        key = (np.asarray(group).astype(np.int64) << SEQ_BITS) | np.asarray(seq, np.int64)
        return np.searchsorted(self.starts, key, "right") - 1


def is_time_ordered(start: Any) -> bool:
    import numpy as np

    return bool(len(start) < 2 or np.all(start[1:] >= start[:-1]))


def time_order(start: Any) -> Any:
    """The order that puts a rank's launches in time order (ties: as given)."""
    import numpy as np

    return np.argsort(start, kind="stable")


# --- pass 1: each partition's rows in each rank's file ------------------------------------------

def survey_source(plan: Partitioning, source: int) -> tuple[Any, Any, Any, Any]:
    """(group, launches, lowest seq, highest seq) of each group a source has launches of."""
    import numpy as np

    s = plan.sources[source]
    c = s.read(0, s.count, ("group", "seq"))
    group = s.group_map[np.asarray(c["group"], np.intp)].astype(np.int64)
    seq = np.asarray(c["seq"], np.int64)
    if not len(seq):
        z = np.zeros(0, np.int64)
        return z, z, z, z
    order = np.lexsort((seq, group))
    group, seq = group[order], seq[order]
    heads = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    tails = np.r_[heads[1:], len(group)] - 1
    return group[heads], tails - heads + 1, seq[heads], seq[tails]


def extents(plan: Partitioning, surveys: list[tuple[Any, Any, Any, Any]]) -> tuple[Any, Any, Any]:
    """Per group: its launches over every rank, its lowest and highest seq (-1: none)."""
    import numpy as np

    groups = len(plan.group_keys)
    launches = np.zeros(groups, np.int64)
    low = np.full(groups, 1 << SEQ_BITS, np.int64)
    high = np.full(groups, -1, np.int64)
    for group, count, lo, hi in surveys:
        np.add.at(launches, group, count)
        np.minimum.at(low, group, lo)
        np.maximum.at(high, group, hi)
    return launches, np.where(high >= 0, low, 0), high


def cut(plan: Partitioning, surveys: list[tuple[Any, Any, Any, Any]],
        target: int = TARGET_LAUNCHES) -> None:
    """The partitions: consecutive ranges of instance keys (group, seq) of about ``target``
    launches each — small groups together, a large group's sequence cut in stretches of about
    as many launches (its launches taken as spread evenly over its sequence)."""
    import numpy as np

    launches, low, high = extents(plan, surveys)
    starts = [0]
    filled = 0
    for g in np.flatnonzero(launches).tolist():
        size = int(launches[g])
        if size > target:  # this group's sequence in stretches, each a partition
            pieces = -(-size // target)
            span = int(high[g]) + 1 - int(low[g])
            edges = [int(low[g]) + span * i // pieces for i in range(pieces)]
            starts += [(g << SEQ_BITS) | e for e in edges if (g << SEQ_BITS) | e > starts[-1]]
            starts.append((g + 1) << SEQ_BITS)
            filled = 0
            continue
        if filled and filled + size > target:
            starts.append(g << SEQ_BITS)
            filled = 0
        filled += size
    plan.starts = np.unique(np.array(starts, np.int64))
    plan.partitions = len(plan.starts)


def reference_of(plan: Partitioning) -> dict[str, Any]:
    """The first rank's launches, by instance key: what every rank's clock is fitted against
    (each launch's end less the first rank's end of the same instance)."""
    import numpy as np

    s = plan.sources[0]
    c = s.read(0, s.count, ("group", "seq", "collective", "size_bytes", "end_us", "kernel"))
    key = (s.group_map[np.asarray(c["group"], np.intp)].astype(np.int64) << SEQ_BITS) \
        | np.asarray(c["seq"], np.int64)
    order = np.argsort(key, kind="stable")
    return {"key": key[order],
            "collective": s.collective_map[np.asarray(c["collective"], np.intp)][order],
            "size": np.asarray(c["size_bytes"], np.int64)[order],
            "end": np.asarray(c["end_us"], np.float64)[order] + s.shift_us}


def spoilt_by(plan: Partitioning, source: int) -> Any:
    """The first rank's instances a rank's launches spoil for the clock fit (it launched
    another collective or size there, or its part was no GPU kernel): indices into the
    reference."""
    import numpy as np

    s = plan.sources[source]
    ref = plan.reference
    if not s.count or not len(ref["key"]):
        return np.zeros(0, np.int64)
    c = s.read(0, s.count, ("group", "seq", "collective", "size_bytes", "kernel"))
    at, shared = _in_reference(ref, s, c)
    collective = s.collective_map[np.asarray(c["collective"], np.intp)][shared]
    spoilt = ((collective != ref["collective"][at])
              | (np.asarray(c["size_bytes"], np.int64)[shared] != ref["size"][at])
              | ~np.asarray(c["kernel"], bool)[shared])
    return np.unique(at[spoilt])


def _in_reference(ref: dict[str, Any], s: Source, c: dict[str, Any]) -> tuple[Any, Any]:
    """Where each launch's instance is in the reference, for the launches whose it is."""
    import numpy as np

    key = (s.group_map[np.asarray(c["group"], np.intp)].astype(np.int64) << SEQ_BITS) \
        | np.asarray(c["seq"], np.int64)
    at = np.minimum(np.searchsorted(ref["key"], key), len(ref["key"]) - 1)
    shared = ref["key"][at] == key
    return at[shared], shared


@dataclass
class Indexed:
    """A source's row range per partition, whether it is in time order, its highest profiler
    step, and its clock against the first rank's."""

    ranges: Any
    ordered: bool
    max_step: int  # -1: none known
    clock: Any  # results.ClockFit


def index_source(plan: Partitioning, source: int) -> Indexed:
    """Pass 1 on one rank's rows (``Indexed``), the reference's spoilt instances known
    (``plan.spoilt``): its clock is the median of its kernels' ends less the first rank's over
    the unspoilt instances both took part in; applied where it stands out of its spread."""
    import numpy as np

    from autoannot.traces.analysis.results import ClockFit

    s = plan.sources[source]
    c = s.read(0, s.count, ("group", "seq", "start_us", "end_us", "step"))
    ranges = np.zeros((plan.partitions, 2), np.int64)
    unfitted = ClockFit(s.rank, 0.0, 0.0, 0, False)
    if not s.count:
        return Indexed(ranges, True, -1, unfitted)
    group = s.group_map[np.asarray(c["group"], np.intp)]
    seq = np.asarray(c["seq"], np.int64)
    if plan.partitions == 1:
        ranges[0] = (0, s.count)
    else:
        part = plan.part_of(group, seq)
        present = np.unique(part)
        rows = np.arange(s.count)
        first = np.full(plan.partitions, s.count, np.int64)
        last = np.full(plan.partitions, -1, np.int64)
        np.minimum.at(first, part, rows)
        np.maximum.at(last, part, rows)
        ranges[present, 0], ranges[present, 1] = first[present], last[present] + 1
    ordered = is_time_ordered(np.asarray(c["start_us"]))
    max_step = int(np.max(np.asarray(c["step"]), initial=-1))
    ref = plan.reference
    if source == 0 or not len(ref["key"]):
        return Indexed(ranges, ordered, max_step, unfitted)
    at, shared = _in_reference(ref, s, c)
    values = np.asarray(c["end_us"], np.float64)[shared] + s.shift_us - ref["end"][at]
    values = values[~np.isnan(values) & ~plan.spoilt[at]]
    if not len(values):
        return Indexed(ranges, ordered, max_step, unfitted)
    offset = float(np.median(values))
    spread = float(np.median(np.abs(values - offset)))
    return Indexed(ranges, ordered, max_step,
                   ClockFit(s.rank, offset, spread, len(values),
                            abs(offset) > max(1.0, 3 * spread)))


# --- pass 2: a partition's launches matched into instances ---------------------------------------

@dataclass
class Matched:
    """A partition's valid instances (in (group, seq) order) and their launches (by instance,
    then rank), with the facts the driver keeps."""

    key: Any
    collective: Any
    size_bytes: Any
    members: Any
    needed: Any
    step: Any
    dtype: Any
    kernel: Any
    offsets: Any
    conflicts: Any  # keys of the instances the ranks launched differently (left out)
    launch: dict[str, Any] = field(default_factory=dict)  # column, start, end, site, prev_*


def read_partition(plan: Partitioning, k: int) -> dict[str, Any]:
    """Every launch of partition ``k``, on the plan's codes, with its previous launch's key and
    end and its next launch's start on its rank. Each rank's range is read as it lies (one
    ``pread`` a column, a row either side for the neighbours), then all at once: codes
    mapped, neighbours taken, the partition's rows kept."""
    import numpy as np

    raw: dict[str, list[Any]] = {n: [] for n in READ}
    spans = []  # (column, rows read)
    for column, s in enumerate(plan.sources):
        lo, hi = (int(v) for v in plan.ranges[column, k])
        if lo >= hi:
            continue
        a, b = max(0, lo - 1), min(s.count, hi + 1)
        for name, values in s.read(a, b).items():
            raw[name].append(values)
        spans.append((column, b - a))
    if not spans:
        return _no_launches()
    columns = np.array([c for c, _ in spans], np.int32)
    lengths = np.array([n for _, n in spans], np.int64)
    column = np.repeat(columns, lengths)
    got = {n: np.concatenate(v) for n, v in raw.items()}
    del raw
    total = len(column)
    # codes onto the plan's: each source's tables, end to end
    def mapped(name: str, field_name: str, dtype: Any) -> Any:
        tables = [getattr(plan.sources[c], field_name) for c in columns.tolist()]
        at = np.concatenate([[0], np.cumsum([len(t) for t in tables])])[:-1]
        flat = np.concatenate(tables).astype(dtype)
        return flat[np.repeat(at, lengths) + got[name].astype(np.int64)]

    group = mapped("group", "group_map", np.int32)
    seq = got["seq"].astype(np.int64, copy=False)
    shifts = np.array([plan.sources[c].shift_us for c in columns.tolist()])
    start = got["start_us"].astype(np.float64, copy=False)
    end = got["end_us"].astype(np.float64, copy=False)
    if shifts.any():
        by = np.repeat(shifts, lengths)
        start, end = start + by, end + by
    key = (group.astype(np.int64) << SEQ_BITS) | seq
    # each row's neighbours on its rank: the rows before and after it in its range (the first
    # and last rows read are there for that: none before a file's first row, or after its last)
    first_row = np.zeros(total, bool)
    first_row[np.concatenate([[0], np.cumsum(lengths)[:-1]])] = True
    last_row = np.zeros(total, bool)
    last_row[np.cumsum(lengths) - 1] = True
    mine = (plan.part_of(group, seq) == k) if plan.partitions > 1 else np.ones(total, bool)
    mine = np.flatnonzero(mine)
    before, after = np.maximum(mine - 1, 0), np.minimum(mine + 1, total - 1)
    has_before, has_after = ~first_row[mine], ~last_row[mine]
    return {
        "group": group[mine], "seq": seq[mine],
        "collective": mapped("collective", "collective_map", np.int32)[mine],
        "size_bytes": got["size_bytes"].astype(np.int64, copy=False)[mine],
        "start_us": start[mine], "end_us": end[mine],
        "site": np.where(got["site"][mine] < 0, -1, mapped("site", "site_map", np.int32)[mine]),
        "kernel": got["kernel"].astype(bool)[mine],
        "step": got["step"].astype(np.int32, copy=False)[mine],
        "dtype": mapped("dtype", "dtype_map", np.int16)[mine],
        "column": column[mine],
        "prev_key": np.where(has_before, key[before], -1),
        "prev_end": np.where(has_before, end[before], np.nan),
        "next_start": np.where(has_after, start[after], np.nan)}


def _no_launches() -> dict[str, Any]:
    import numpy as np

    kinds = {"group": np.int32, "seq": np.int64, "collective": np.int32,
             "size_bytes": np.int64, "start_us": np.float64, "end_us": np.float64,
             "site": np.int32, "kernel": bool, "step": np.int32, "dtype": np.int16,
             "column": np.int32, "prev_key": np.int64, "prev_end": np.float64,
             "next_start": np.float64}
    return {n: np.zeros(0, t) for n, t in kinds.items()}


def match_partition(plan: Partitioning, k: int, launches: dict[str, Any] | None = None) -> Matched:
    """Partition ``k``'s launches sorted into instances: those the ranks launched differently
    left out (their keys kept), the others' facts, and the clock estimates."""
    import numpy as np

    got = read_partition(plan, k) if launches is None else launches
    width = plan.width
    order, key = _sorted_by_instance(got["group"], got["seq"], got["column"], width,
                                     len(plan.group_keys))
    total = len(key)
    head = np.ones(total, dtype=bool)
    head[1:] = key[1:] != key[:-1]
    column = got["column"][order]
    twice = np.flatnonzero(~head[1:] & (column[1:] == column[:-1]))
    if len(twice):
        raise _twice(plan, int(key[twice[0]]), int(column[twice[0]]))
    unique = key[head]
    segment = np.cumsum(head, dtype=np.int64) - 1
    first = np.flatnonzero(head)
    count = len(unique)
    coll, size = got["collective"][order], got["size_bytes"][order]
    disagree = (coll != coll[first][segment]) | (size != size[first][segment])
    conflict = np.bincount(segment, weights=disagree, minlength=count) > 0
    not_kernel = np.bincount(segment, weights=~got["kernel"][order], minlength=count) > 0
    valid = ~conflict
    kept = np.flatnonzero(valid)
    keep_launch = valid[segment]
    keep = order[keep_launch]
    instance_of = (np.cumsum(valid, dtype=np.int64) - 1)[segment[keep_launch]]
    n = len(kept)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(instance_of, minlength=n), out=offsets[1:])
    first_kept = first[kept]
    step = got["step"][keep]
    dtype = got["dtype"][keep]
    launch = {name: got[source][keep] for name, source in (
        ("column", "column"), ("start", "start_us"), ("end", "end_us"), ("site", "site"),
        ("prev_key", "prev_key"), ("prev_end", "prev_end"), ("next_start", "next_start"))}
    kernel = ~not_kernel[kept]
    matched = Matched(
        key=unique[kept], collective=coll[first_kept], size_bytes=size[first_kept],
        members=np.diff(offsets).astype(np.int32),
        needed=plan.group_size[unique[kept] >> SEQ_BITS].astype(np.int32),
        step=np.maximum.reduceat(step, offsets[:-1]) if n else np.zeros(0, np.int32),
        dtype=dtype[offsets[:-1]] if n else np.zeros(0, np.int16),
        kernel=kernel, offsets=offsets, conflicts=unique[conflict], launch=launch)
    return matched


def _twice(plan: Partitioning, key: int, column: int) -> files.TraceError:
    """The refusal of a rank's rows that hold one place of a group's sequence twice (rows made
    in a job whose ranks shared one record file, or put together from two runs)."""
    source = plan.sources[column]
    group, seq = plan.group_keys[key >> SEQ_BITS], key & ((1 << SEQ_BITS) - 1)
    where = source.path or source.origin or f"rank {source.rank}'s launches"
    return files.TraceError(
        f"{where}: rank {source.rank} launched group {group} #{seq} more than once: these rows "
        "hold several ranks' or runs' launches as one rank's (rows made in a job whose ranks "
        "shared one AUTOANNOT_RECORD file are such): give each rank's own record file or "
        "trace instead")


def _sorted_by_instance(group: Any, seq: Any, column: Any, width: int,
                        groups: int) -> tuple[Any, Any]:
    """The order that sorts launches by (group, seq, rank), and each sorted launch's instance
    key. One sort of one 64-bit key where the three fit in it; else a stable sort on (group,
    seq) of launches in rank order."""
    import numpy as np

    if len(seq) and (int(seq.min()) < 0 or int(seq.max()) >= 1 << SEQ_BITS):
        raise files.TraceError("a rows file holds a sequence number outside 0 .. 2^40")
    seq_bits = max(1, int(seq.max()).bit_length()) if len(seq) else 1
    rank_bits = max(1, (width - 1).bit_length())
    group_bits = max(1, (groups - 1).bit_length())
    if group_bits + seq_bits + rank_bits <= 63:
        composite = group.astype(np.int64) << (seq_bits + rank_bits)
        composite |= seq << rank_bits
        composite |= column
        order = np.argsort(composite)
    else:
        by_rank = np.argsort(column, kind="stable")
        order = by_rank[np.argsort(((group.astype(np.int64) << SEQ_BITS) | seq)[by_rank],
                                   kind="stable")]
    key = group[order].astype(np.int64) << SEQ_BITS
    key |= seq[order]
    return order, key


# --- pass 4: a partition's figures --------------------------------------------------------------

@dataclass
class Figured:
    """A partition's per-instance figures (its instances in ``Matched`` order), what the
    driver's cause chains need of its late instances, and its per-rank sums and cells."""

    key: Any
    last: Any
    skew: Any
    straggler: Any  # column of the last to arrive (highest among equals)
    transfer: Any
    total: Any  # the waits of its ranks, added
    straggler_site: Any
    late: Any  # local indices of the instances with skew >= IN_STEP_US
    chain: dict[str, Any]  # per late instance: the straggler's and first's previous launches
    waited: Any  # per column
    bare: int  # launches known by entry alone
    reached: Any  # (group, column, highest seq) of each rank in each group
    cells: Any  # (group, column, x, late): the heat map's cells, the most of each
    launch: dict[str, Any] | None = None  # kept where asked (parts of instances)


def apply_clocks(launch: dict[str, Any], shift: Any) -> None:
    if shift.any():
        by = shift[launch["column"]]
        for name in ("start", "end", "prev_end", "next_start"):
            launch[name] = launch[name] - by


def waits_of(start: Any, end: Any, next_start: Any, last: Any, transfer: Any) -> Any:
    """Each launch's wait: from its arrival to the last rank's, never more than its own time in
    the collective less the transfer; where only its entry is known, never more than until
    its next entry on its rank. (Each argument per launch.)"""
    import numpy as np

    waits = np.fmin(last, end - np.nan_to_num(transfer, nan=0.0)) - start
    bare = np.isnan(end) & ~np.isnan(next_start)
    waits[bare] = np.fmin(waits[bare], next_start[bare] - start[bare])
    np.maximum(waits, 0.0, out=waits)
    return waits


def figure_partition(plan: Partitioning, matched: Matched, shift: Any, heat: dict[str, Any],
                     keep_launches: bool = False) -> Figured:
    """Arrivals, straggler, skew, transfer and waits of each instance of a partition (clocks
    applied: ``shift`` per column), and the pieces the driver joins across partitions."""
    import numpy as np

    launch = dict(matched.launch)
    apply_clocks(launch, shift)
    start, end, column = launch["start"], launch["end"], launch["column"]
    offsets = matched.offsets
    n = len(matched.key)
    width = plan.width
    if n == 0:
        z = np.zeros(0)
        return Figured(matched.key, z, z, np.zeros(0, np.int32), z, z, np.zeros(0, np.int32),
                       np.zeros(0, np.int64), {}, np.zeros(width), 0,
                       np.zeros((0, 3), np.int64), _no_cells(),
                       launch if keep_launches else None)
    heads = offsets[:-1]
    instance_of = np.repeat(np.arange(n), np.diff(offsets))
    first = np.minimum.reduceat(start, heads)
    last = np.maximum.reduceat(start, heads)
    straggler = np.maximum.reduceat(np.where(start == last[instance_of], column, -1), heads)
    at_straggler = np.flatnonzero(column == straggler[instance_of])
    first_column = np.minimum.reduceat(np.where(start == first[instance_of], column, width),
                                       heads)
    at_first = np.flatnonzero(column == first_column[instance_of])
    skew = last - first
    transfer = end[at_straggler] - last
    waits = waits_of(start, end, launch["next_start"], last[instance_of],
                     transfer[instance_of])
    launch["wait"] = waits
    launch["offsets"] = offsets
    total = np.add.reduceat(waits, heads)
    late = np.flatnonzero(skew >= IN_STEP_US)
    s, f = at_straggler[late], at_first[late]
    chain = {"straggler_prev_key": launch["prev_key"][s],
             "straggler_prev_end": launch["prev_end"][s], "straggler_start": start[s],
             "first_prev_key": launch["prev_key"][f], "first_prev_end": launch["prev_end"][f],
             "first_start": start[f]}
    group = (matched.key >> SEQ_BITS).astype(np.int64)
    seq = matched.key & ((1 << SEQ_BITS) - 1)
    # each rank's furthest instance in each group
    pair = group[instance_of] * width + column
    order = np.lexsort((seq[instance_of], pair))
    ends = np.flatnonzero(np.r_[pair[order][1:] != pair[order][:-1], True])
    furthest = order[ends]
    reached = np.stack([group[instance_of][furthest], column[furthest],
                        seq[instance_of][furthest]], axis=1)
    # heat-map cells: how late each rank arrived, the most per (group, rank, step or bin)
    if heat["by_step"]:  # (x: the step + 1; 0: none known)
        x = matched.step.astype(np.int64)[instance_of] + 1
    else:
        low, span, bins = heat["seq_low"], heat["seq_span"], heat["bins"]
        g = group[instance_of]
        x = (seq[instance_of] - low[g]) * bins[g] // np.maximum(span[g], 1)
    cells = merge_cells([((group[instance_of] * width + column) * heat["span"] + x,
                          start - first[instance_of])])
    return Figured(
        key=matched.key, last=last, skew=skew, straggler=straggler.astype(np.int32),
        transfer=transfer, total=total, straggler_site=launch["site"][at_straggler],
        late=late, chain=chain, waited=np.bincount(column, weights=waits, minlength=width),
        bare=int(np.isnan(end).sum()), reached=reached, cells=cells,
        launch=launch if keep_launches else None)


def _no_cells() -> Any:
    import numpy as np

    return (np.zeros(0, np.int64), np.zeros(0))


def merge_cells(parts: list[tuple[Any, Any]]) -> Any:
    """(cell keys, the most of each) of several sets of cells; a cell's key is
    ``(group * width + column) * span + x``."""
    import numpy as np

    key = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
    value = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0)
    if not len(key):
        return key, value
    order = np.argsort(key, kind="stable")
    key, value = key[order], value[order]
    heads = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    return key[heads], np.maximum.reduceat(value, heads)

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

1. Per rank (``index_source``), in tasks of many ranks, one read of the rank's file: each
   partition's row range in it, the first rank's instances this rank spoils for the clock
   fit (it disagreed there, or ran off a GPU kernel), and the rank's clock: the median of
   its kernels' ends less the first rank's over the instances both ran (found by place in
   the first rank's launches: no sort) and it did not spoil. A rank whose clock was fitted
   on an instance another rank spoils is fitted again, every spoilt instance known
   (``needs_refit``: none, where every rank ran the same kernels). A few numbers a rank
   come back. The cut (``cut``) before: by the groups' extents, which rows heads say
   (``survey_source`` reads them where a head does not).
2. ``match_partition`` then ``figure_partition`` (per partition, clocks applied): launches
   placed into instances (by arithmetic where a group's sequence is dense, else sorted),
   conflicts, the instances' facts; arrivals, straggler, skew, transfer, each launch's wait
   and per-rank sums, what the cause chains need, heat-map cells — each a reduction over an
   instance's consecutive launches (taken in instance order, ``reduceat``), or over the
   launches in any order into per-pair tables.
3. The driver (``driver``): cause chains and blame over all instances, per-rank figures.

A job of up to ``IN_MEMORY_LAUNCHES`` launches that one process analyses is one partition,
and pass 1 reads nothing of its own: ``passes.index_in_memory`` finds the same (the spoilt
instances, the clocks) in the partition's one read.

Each launch's previous and next launch *on its rank* (the lateness a straggler carried in,
the bound on an entry-only wait) are the rows before and after it in its rank's file: known
to the partition with no other rank's data (at a range's ends, the rows either side, read
by the same ``preadv`` into arrays of their own: the partition's columns hold its rows
alone).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoannot.traces import files
from autoannot.traces.analysis.results import IN_STEP_US

SEQ_BITS = 40  # an instance key is group << 40 | seq
#: Launches a partition holds at most, about (its working set: ~150 bytes a launch).
TARGET_LAUNCHES = 4_000_000
#: Launches of a job analysed whole, in one process, as one partition, where no partition
#: size is asked (``passes.index_in_memory``: each file read once; ~90 bytes a launch at the
#: peak, ~2 GB at this many).
IN_MEMORY_LAUNCHES = 24_000_000
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
    same_codes: tuple[str, ...] = ()  # the coded columns whose codes are the plan's already
    steps: Any = None  # (``_steps``: how its columns are read, worked out once)

    def read(self, lo: int, hi: int, names: tuple[str, ...] = READ) -> dict[str, Any]:
        """Rows ``lo`` to ``hi`` of the named columns (missing columns of version 1 files:
        step -1, dtype 0)."""
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

    def read_into(self, lo: int, hi: int, out: dict[str, Any], at: int,
                  edges: dict[str, Any] | None = None, edge_at: int = 0,
                  views: dict[str, tuple[Any, Any]] | None = None) -> None:
        """Rows ``lo`` to ``hi`` of every column of ``out`` (``LAUNCH_KINDS``), into its rows
        from ``at`` on: read straight into them where the file's type is theirs, the codes
        mapped onto the plan's (``CODED``), missing columns as ``read`` gives them. Where
        ``edges`` is given, the rows either side (the launches before and after on this rank,
        where the file has them) land in its rows ``edge_at`` and ``edge_at + 1``, by the
        same read. (Called once a rank a partition: what can be worked out once a rank is,
        ``_steps``; ``views``, the bytes of ``out``'s and ``edges``' columns, once a
        partition.)"""
        rows = hi - lo
        edges = edges or {}
        before, after = int(lo > 0), int(hi < self.count)
        if self.columns is not None or self.path is None or self.kinds is None:
            for name, values in self.read(lo - before, hi + after, tuple(out)).items():
                self._land(name, values[before:before + rows], out[name][at:at + rows])
                if name in edges:
                    self._land_edges(name, values, before, after, edges[name], edge_at)
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if 2 * rows >= self.count:  # (most of the file: all its columns in one read)
                self._read_whole_into(fd, lo, hi, out, at, edges, edge_at)
                return
            for name, offset, width, kind, direct in self._steps(out):
                if kind is None:  # (a column this file has not)
                    self._land(name, np.full(rows, -1 if name == "step" else 0, np.int32),
                               out[name][at:at + rows])
                    if name in edges:
                        edges[name][edge_at:edge_at + 2] = -1 if name == "step" else 0
                    continue
                # (the rows either side too, by the same read, where ``edges`` keeps them)
                ahead, behind = (before, after) if name in edges else (0, 0)
                if direct:  # (straight into the columns: slices of their bytes)
                    if views is None:
                        main = memoryview(out[name][at:at + rows].view(np.uint8))
                        edge = memoryview(edges[name][edge_at:edge_at + 2].view(np.uint8)) \
                            if name in edges else None
                        base = 0
                    else:
                        whole, edge = views[name]
                        main = whole[width * at:width * (at + rows)]
                        base = width * edge_at
                    buffers = [main]
                    if ahead:
                        buffers.insert(0, edge[base:base + width])
                    if behind:
                        buffers.append(edge[base + width:base + 2 * width])
                    got = os.preadv(fd, buffers, offset + width * (lo - ahead))
                else:
                    buffer = bytearray(width * (rows + ahead + behind))
                    got = os.preadv(fd, [buffer], offset + width * (lo - ahead))
                if got != width * (rows + ahead + behind):
                    raise files.TraceError(f"{self.path}: cut short while it was read")
                if not direct:
                    values = np.frombuffer(buffer, dtype=kind)
                    self._land(name, values[ahead:ahead + rows], out[name][at:at + rows])
                    if name in edges:
                        self._land_edges(name, values, ahead, behind, edges[name], edge_at)
        finally:
            os.close(fd)

    def _land_edges(self, name: str, values: Any, before: int, after: int, edges: Any,
                    edge_at: int) -> None:
        """The rows either side of a range read (``values``: the range with them) into
        ``edges`` at ``edge_at`` (before) and ``edge_at + 1`` (after), where there are: codes
        onto the plan's."""
        table = getattr(self, CODED[name]) if name in CODED and name not in self.same_codes \
            else None
        if before:
            edges[edge_at] = values[0] if table is None else table[int(values[0])]
        if after:
            edges[edge_at + 1] = values[-1] if table is None else table[int(values[-1])]

    def _read_whole_into(self, fd: int, lo: int, hi: int, out: dict[str, Any], at: int,
                         edges: dict[str, Any] | None = None, edge_at: int = 0) -> None:
        """``read_into`` by one read of every column's rows (of ``lo`` on), copied from it."""
        rows = hi - lo
        steps = self._steps(out)
        if lo == 0 and hi == self.count and self._read_in_place(fd, steps, out, at):
            return
        size = sum(self.count * int(kind[-1]) for _, kind in self.kinds or ())
        data = os.pread(fd, size, self.data_offset)
        if len(data) != size:
            raise files.TraceError(f"{self.path}: cut short while it was read")
        edges = edges or {}
        before, after = int(lo > 0), int(hi < self.count)
        for name, offset, width, kind, direct in steps:
            into = out[name][at:at + rows]
            if kind is None:  # (a column this file has not)
                self._land(name, np.full(rows, -1 if name == "step" else 0, np.int32), into)
                if name in edges:
                    edges[name][edge_at:edge_at + 2] = -1 if name == "step" else 0
                continue
            values = np.frombuffer(data, kind, rows + before + after,
                                   offset - self.data_offset + width * (lo - before))
            if direct:
                into.view(kind)[...] = values[before:before + rows]
            else:
                self._land(name, values[before:before + rows], into)
            if name in edges:
                self._land_edges(name, values, before, after, edges[name], edge_at)

    def _read_in_place(self, fd: int, steps: list[tuple[str, int, int, Any, bool]],
                       out: dict[str, Any], at: int) -> bool:
        """Every row of the file by one ``preadv``: each column straight into its rows of
        ``out`` where it is read so (``_steps``), the others (and columns no read wants)
        into buffers landed after. False where the file's columns are not laid end to end
        from its data's start (nothing read then)."""
        rows = self.count
        step_of = {step[0]: step for step in steps}
        buffers: list[Any] = []
        later: list[tuple[str, Any, Any]] = []
        offset = self.data_offset
        for name, kind in self.kinds or ():
            width = int(kind[-1])
            step = step_of.get(name)
            if step is None or step[1] != offset:
                if step is not None:
                    return False
                buffers.append(bytearray(width * rows))  # (a column no read wants)
            elif step[4]:  # (read straight into its rows)
                buffers.append(out[name][at:at + rows].view(np.uint8))
            else:
                buffer = bytearray(width * rows)
                buffers.append(buffer)
                later.append((name, buffer, step[3]))
            offset += width * rows
        if os.preadv(fd, buffers, self.data_offset) != offset - self.data_offset:
            raise files.TraceError(f"{self.path}: cut short while it was read")
        for name, buffer, kind in later:
            self._land(name, np.frombuffer(buffer, dtype=kind), out[name][at:at + rows])
        for name, _, _, kind, _ in steps:
            if kind is None:  # (a column this file has not)
                self._land(name, np.full(rows, -1 if name == "step" else 0, np.int32),
                           out[name][at:at + rows])
        return True

    def _steps(self, out: dict[str, Any]) -> list[tuple[str, int, int, Any, bool]]:
        """How each column of ``out`` (``LAUNCH_KINDS``, as every read's) is read from this
        rank's file: (name, where the column begins, bytes a row, its type there (None: not
        there), whether it is read straight into ``out``: the same type, or codes already
        the plan's and as wide). Worked out once: the same for every partition."""
        if self.steps is not None:
            return self.steps
        where: dict[str, tuple[int, str]] = {}
        offset = self.data_offset
        for name, kind in self.kinds or ():
            where[name] = (offset, kind)
            offset += self.count * int(kind[-1])
        steps = []
        for name, values in out.items():
            if name not in where:
                steps.append((name, 0, 0, None, False))
                continue
            offset, kind = where[name]
            file_type = np.dtype(kind)
            direct = (file_type == values.dtype and name not in CODED) \
                or (name in self.same_codes and file_type.itemsize == values.itemsize) \
                or (name == "kernel" and kind == "u1")
            steps.append((name, offset, file_type.itemsize, file_type, direct))
        self.steps = steps
        return steps

    def _land(self, name: str, values: Any, into: Any) -> None:
        """``values`` of column ``name`` into ``into``: codes onto the plan's."""
        if name in CODED and name not in self.same_codes and len(values):
            np.take(getattr(self, CODED[name]), values.astype(np.intp, copy=False), out=into)
        else:
            into[...] = values


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

    shift: Any = None  # each column's clock offset, taken out (pass 2)
    reference: dict[str, Any] = field(default_factory=dict)  # the first rank's, by key
    spoilt: Any = None  # the reference's instances no clock is fitted on
    #: Per source: (group, launches, lowest seq, highest seq) of its groups (None: unknown
    #: until read: ``survey_source``).
    surveys: list[Any] = field(default_factory=list)
    heat: dict[str, Any] = field(default_factory=dict)  # how pass 2 keys its heat map's cells

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
        if self.partitions == 1:
            return np.zeros(len(seq), np.int64)
        key = (np.asarray(group).astype(np.int64) << SEQ_BITS) | np.asarray(seq, np.int64)
        return np.searchsorted(self.starts, key, "right") - 1


def is_time_ordered(start: Any) -> bool:
    return bool(len(start) < 2 or np.all(start[1:] >= start[:-1]))


def time_order(start: Any) -> Any:
    """The order that puts a rank's launches in time order (ties: as given)."""
    return np.argsort(start, kind="stable")


# --- pass 1: each partition's rows in each rank's file ------------------------------------------

def survey_source(plan: Partitioning, source: int) -> tuple[Any, Any, Any, Any]:
    """(group, launches, lowest seq, highest seq) of each group a source has launches of."""
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


def surveys_of(launches: dict[str, Any], width: int, groups: int) -> list[Any]:
    """What ``survey_source`` finds of each rank, from launches read (``read_partition``'s, of
    every row): (group, launches, lowest seq, highest seq) of each group it has launches of."""
    z = np.zeros(0, np.int64)
    found: list[Any] = [(z, z, z, z)] * width
    if not len(launches["seq"]):
        return found
    pair = launches["column"].astype(np.int32 if width * groups < 1 << 31 else np.int64)
    pair *= groups
    pair += launches["group"]
    seq = launches["seq"]
    if width * groups <= 4 * len(pair) + (1 << 20):  # (a table of every pair: no compacting)
        count = np.bincount(pair, minlength=width * groups)
        present = np.flatnonzero(count)
        count = count[present]
        slot, size = pair, width * groups
    else:  # (reductions into a few arrays of the pairs present)
        present, slot = _compact(pair)
        del pair
        count = np.bincount(slot, minlength=len(present))
        size = len(present)
    low = np.full(size, 1 << SEQ_BITS, np.int64)
    high = np.full(size, -1, np.int64)
    np.minimum.at(low, slot, seq)
    np.maximum.at(high, slot, seq)
    if size != len(present):
        low, high = low[present], high[present]
    column = present // groups
    cuts = np.searchsorted(column, np.arange(width + 1))
    for c in np.unique(column).tolist():
        a, b = cuts[c], cuts[c + 1]
        found[c] = (present[a:b] % groups, count[a:b].astype(np.int64), low[a:b], high[a:b])
    return found


def extents(plan: Partitioning, surveys: list[tuple[Any, Any, Any, Any]]) -> tuple[Any, Any, Any]:
    """Per group: its launches over every rank, its lowest and highest seq (-1: none)."""
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
    (each launch's end less the first rank's end of the same instance). Its table of places
    (``dense_reference``) made here, once, for every task."""
    s = plan.sources[0]
    c = s.read(0, s.count, ("group", "seq", "collective", "size_bytes", "end_us", "kernel"))
    key = (s.group_map[np.asarray(c["group"], np.intp)].astype(np.int64) << SEQ_BITS) \
        | np.asarray(c["seq"], np.int64)
    order = np.argsort(key, kind="stable")
    ref = {"key": key[order],
           "collective": s.collective_map[np.asarray(c["collective"], np.intp)][order],
           "size": np.asarray(c["size_bytes"], np.int64)[order],
           "end": np.asarray(c["end_us"], np.float64)[order] + s.shift_us}
    ref["dense"] = dense_reference(ref, len(plan.group_keys))
    return ref


def in_reference(ref: dict[str, Any], group: Any, seq: Any) -> tuple[Any, Any]:
    """Of launches (``group`` on the plan's codes, ``seq``): where each one's instance is in
    the reference, for those whose it is, and their indices. By arithmetic where the
    reference's groups' sequences are dense (``dense_reference``), else by search."""
    dense = ref.get("dense")
    if dense is None:
        dense = ref["dense"] = dense_reference(ref, int(group.max(initial=0)) + 1)
    if dense is False:
        key = (group.astype(np.int64) << SEQ_BITS) | seq
        at = np.searchsorted(ref["key"], key)
        np.minimum(at, len(ref["key"]) - 1, out=at)
        shared = np.flatnonzero(ref["key"][at] == key)
        return at[shared], shared
    low, span, first, table = dense
    inside = group < len(low)
    g = np.where(inside, group, 0)
    offset = seq - np.take(low, g)
    inside &= (offset >= 0) & (offset < np.take(span, g))
    place = np.where(inside, offset + np.take(first, g), 0)
    at = np.take(table, place)
    shared = np.flatnonzero(inside & (at >= 0))
    return at[shared].astype(np.int64), shared


def dense_reference(ref: dict[str, Any], groups: int) -> Any:
    """(each group's lowest seq, its span, its first place, and the reference's index at each
    place: -1 where none) of the reference's launches; False where a table of their groups'
    sequences would be sparse."""
    if not len(ref["key"]):
        return False
    group = (ref["key"] >> SEQ_BITS).astype(np.int64)
    seq = ref["key"] & ((1 << SEQ_BITS) - 1)
    groups = max(groups, int(group.max()) + 1)
    low = np.full(groups, 1 << SEQ_BITS, np.int64)
    high = np.full(groups, -1, np.int64)
    np.minimum.at(low, group, seq)
    np.maximum.at(high, group, seq)
    span = np.where(high >= low, high - low + 1, 0)
    if int(span.sum()) > 2 * len(seq) + (1 << 20):
        return False
    first = np.concatenate([[0], np.cumsum(span)[:-1]])
    table = np.full(int(span.sum()), -1, np.int32 if len(seq) < 1 << 31 else np.int64)
    table[first[group] + seq - low[group]] = np.arange(len(seq))
    if int(np.count_nonzero(table >= 0)) != len(seq):  # (an instance twice: as searched)
        return False
    return low, span, first, table


def spoils(ref: dict[str, Any], at: Any, collective: Any, size: Any, kernel: Any) -> Any:
    """Which of some launches (at the reference's instances ``at``) spoil their instance for
    the clock fit: another collective or size than the first rank's there, or no GPU
    kernel."""
    return (collective != ref["collective"][at]) | (size != ref["size"][at]) | ~kernel


def median(values: Any) -> float:
    """``numpy.median`` of some numbers (no NaN), as it finds it (the middle one, or the mean
    of the two middle ones), without its general machinery: it is taken once or twice a
    rank."""
    half = len(values) // 2
    if len(values) % 2:
        return float(np.partition(values, half)[half])
    middle = np.partition(values, (half - 1, half))
    return float((middle[half - 1] + middle[half]) / 2)


@dataclass
class Indexed:
    """A source's row range per partition, whether it is in time order, its highest profiler
    step, and its clock against the first rank's; the reference's instances it spoils, and
    those its clock was fitted on (ranges of reference indices; None: too many ranges to
    say), so that a clock fitted before every rank's spoilt instances were known can be
    told still right."""

    ranges: Any
    ordered: bool
    max_step: int  # -1: none known
    clock: Any  # results.ClockFit
    spoilt: Any = None  # indices into the reference
    fitted_on: Any = None  # (k, 2) ranges [a, b) of reference indices


#: The most ranges of reference indices a source says its clock was fitted on.
FITTED_RANGES = 64


def index_source(plan: Partitioning, source: int) -> Indexed:
    """Pass 1 on one rank's rows (``Indexed``): its row ranges, the reference's instances it
    spoils (``spoils``), and its clock: the median of its kernels' ends less the first rank's
    over the instances both took part in that no rank spoils — those known (``plan.spoilt``,
    a refit), or else those this rank does not spoil (right unless another rank spoils one:
    ``needs_refit``); applied where it stands out of its spread."""
    from autoannot.traces.analysis.results import ClockFit

    s = plan.sources[source]
    c = s.read(0, s.count, ("group", "seq", "start_us", "end_us", "step", "collective",
                            "size_bytes", "kernel"))
    ranges = np.zeros((plan.partitions, 2), np.int64)
    unfitted = ClockFit(s.rank, 0.0, 0.0, 0, False)
    none = np.zeros(0, np.int64)
    if not s.count:
        return Indexed(ranges, True, -1, unfitted, none, np.zeros((0, 2), np.int64))
    group = s.group_map[np.asarray(c["group"], np.intp)]
    seq = np.asarray(c["seq"], np.int64)
    if plan.partitions == 1:
        ranges[0] = (0, s.count)
    else:
        part = plan.part_of(group, seq)
        rows = np.arange(s.count)
        first = np.full(plan.partitions, s.count, np.int64)
        last = np.full(plan.partitions, -1, np.int64)
        np.minimum.at(first, part, rows)
        np.maximum.at(last, part, rows)
        present = np.flatnonzero(last >= 0)
        ranges[present, 0], ranges[present, 1] = first[present], last[present] + 1
    ordered = is_time_ordered(np.asarray(c["start_us"]))
    max_step = int(np.max(np.asarray(c["step"]), initial=-1))
    ref = plan.reference
    if not len(ref["key"]):
        return Indexed(ranges, ordered, max_step, unfitted, none, np.zeros((0, 2), np.int64))
    at, shared = in_reference(ref, group, seq)
    bad = spoils(ref, at, s.collective_map[np.asarray(c["collective"], np.intp)][shared],
                 np.asarray(c["size_bytes"], np.int64)[shared],
                 (np.asarray(c["kernel"]) == 1)[shared])
    spoilt = np.unique(at[bad]) if bad.any() else none
    if source == 0:  # (the reference itself: no clock fitted)
        return Indexed(ranges, ordered, max_step, unfitted, spoilt, np.zeros((0, 2), np.int64))
    values = np.asarray(c["end_us"], np.float64)[shared] + s.shift_us - ref["end"][at]
    fitted = ~np.isnan(values) & ~(bad if plan.spoilt is None else plan.spoilt[at] | bad)
    values = values[fitted]
    if not len(values):
        return Indexed(ranges, ordered, max_step, unfitted, spoilt, np.zeros((0, 2), np.int64))
    offset = median(values)
    spread = median(np.abs(values - offset))
    return Indexed(ranges, ordered, max_step,
                   ClockFit(s.rank, offset, spread, len(values),
                            abs(offset) > max(1.0, 3 * spread)),
                   spoilt, _ranges_of(at[fitted], len(ref["key"])))


def _ranges_of(places: Any, size: int) -> Any:
    """The indices ``places`` (under ``size``) as ranges [a, b) in order; None where there
    are more than ``FITTED_RANGES``."""
    taken = np.zeros(size + 2, np.int8)
    taken[places + 1] = 1
    edges = np.flatnonzero(np.diff(taken))
    if len(edges) > 2 * FITTED_RANGES:
        return None
    return edges.reshape(-1, 2)


def needs_refit(one: Indexed, spoilt: Any) -> bool:
    """Whether a clock ``index_source`` fitted before every rank's spoilt instances were known
    (the reference's indices ``spoilt``, sorted) was fitted on one of them."""
    if one.fitted_on is None:
        return bool(len(spoilt))
    if not len(one.fitted_on) or not len(spoilt):
        return False
    lo = np.searchsorted(spoilt, one.fitted_on[:, 0])
    hi = np.searchsorted(spoilt, one.fitted_on[:, 1])
    return bool(np.any(hi > lo))


# --- pass 2: a partition's launches matched into instances, then its figures -------------------

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


#: Each launch column a partition's read gives, and its numpy type.
LAUNCH_KINDS = {"group": "<i4", "seq": "<i8", "collective": "<i4", "size_bytes": "<i8",
                "start_us": "<f8", "end_us": "<f8", "site": "<i4", "kernel": "?",
                "step": "<i4", "dtype": "<i2"}
#: The columns of the rows either side of a rank's range that a partition keeps: its launches'
#: previous (key and end) and next (start).
EDGES = ("group", "seq", "start_us", "end_us")
#: The columns read as codes of the source's own, mapped onto the plan's (its map's field).
CODED = {"group": "group_map", "collective": "collective_map", "site": "site_map",
         "dtype": "dtype_map"}


def read_partition(plan: Partitioning, k: int) -> dict[str, Any]:
    """Every launch of partition ``k``, on the plan's codes, with what its rank launched
    before and after it. Each rank's range is read as it lies (one ``preadv`` a column, the
    rows either side of the range by the same read, into their own arrays) into the
    partition's columns, its codes mapped as it lands. A launch's previous and next on its
    rank are the rows before and after it, or at a range's ends the rows either side
    (``previous_of``, ``next_start_of``); where ranges hold other partitions' rows too (a
    rank's groups interleaved in time), the partition's are said (``mine``)."""
    spans = []  # (column, first row, rows)
    for column in range(len(plan.sources)):
        lo, hi = (int(v) for v in plan.ranges[column, k])
        if lo < hi:
            spans.append((column, lo, hi - lo))
    if not spans:
        return _no_launches()
    columns = np.array([c for c, _, _ in spans], np.int32)
    lengths = np.array([n for _, _, n in spans], np.int64)
    total = int(lengths.sum())
    got = {name: np.empty(total, kind) for name, kind in LAUNCH_KINDS.items()}
    edges = {name: np.empty(2 * len(spans), LAUNCH_KINDS[name]) for name in EDGES}
    views = {name: (memoryview(got[name].view(np.uint8)),
                    memoryview(edges[name].view(np.uint8)) if name in edges else None)
             for name in LAUNCH_KINDS}
    at = 0
    for i, (column, lo, rows) in enumerate(spans):
        plan.sources[column].read_into(lo, lo + rows, got, at, edges, 2 * i, views)
        at += rows
    column = np.repeat(columns, lengths)
    group, seq = got["group"], got["seq"]
    shifts = np.array([plan.sources[c].shift_us for c in columns.tolist()])
    if shifts.any():
        by = np.repeat(shifts, lengths)
        got["start_us"] += by
        got["end_us"] += by
        edges["start_us"] += np.repeat(shifts, 2)
        edges["end_us"] += np.repeat(shifts, 2)
    ends = np.cumsum(lengths)
    first_row = np.zeros(total, bool)  # (a range's first row and last row)
    first_row[ends - lengths] = True
    last_row = np.zeros(total, bool)
    last_row[ends - 1] = True
    before = np.array([lo > 0 for _, lo, _ in spans])
    after = np.array([lo + rows < plan.sources[c].count for c, lo, rows in spans])
    before_key = edges["group"][0::2].astype(np.int64)
    before_key <<= SEQ_BITS
    before_key |= edges["seq"][0::2]
    got.update(column=column, first_row=first_row, last_row=last_row,
               span_column=columns,
               before_key=np.where(before, before_key, -1),
               before_end=np.where(before, edges["end_us"][0::2], np.nan),
               after_start=np.where(after, edges["start_us"][1::2], np.nan))
    if plan.partitions > 1:  # (the partition's rows: its keys between its bounds)
        key = group.astype(np.int64)
        key <<= SEQ_BITS
        key |= seq
        inside = key >= plan.starts[k]
        if k + 1 < plan.partitions:
            inside &= key < plan.starts[k + 1]
        del key
        if not inside.all():
            got["mine"] = np.flatnonzero(inside)
    return got


def previous_of(launch: dict[str, Any], rows: Any) -> tuple[Any, Any]:
    """(instance key, end) of the launch before each of ``rows`` on its rank (-1, NaN: none)."""
    before = np.maximum(rows - 1, 0)
    key = launch["group"][before].astype(np.int64)
    key <<= SEQ_BITS
    key |= launch["seq"][before]
    end = launch["end_us"][before]
    head = launch["first_row"][rows]
    if head.any():
        span = _span_of(launch, rows[head])
        key[head] = launch["before_key"][span]
        end[head] = launch["before_end"][span]
    return key, end


def next_start_of(launch: dict[str, Any], rows: Any) -> Any:
    """The start of the launch after each of ``rows`` on its rank (NaN: none)."""
    start = launch["start_us"][np.minimum(rows + 1, len(launch["start_us"]) - 1)]
    tail = launch["last_row"][rows]
    if tail.any():
        start[tail] = launch["after_start"][_span_of(launch, rows[tail])]
    return start


def _span_of(launch: dict[str, Any], rows: Any) -> Any:
    """The range (of ``read_partition``'s) each of ``rows`` was read in."""
    return np.searchsorted(np.flatnonzero(launch["first_row"]), rows, "right") - 1


def _no_launches() -> dict[str, Any]:
    got = {name: np.zeros(0, kind) for name, kind in LAUNCH_KINDS.items()}
    got.update(column=np.zeros(0, np.int32), first_row=np.zeros(0, bool),
               last_row=np.zeros(0, bool), span_column=np.zeros(0, np.int32),
               before_key=np.zeros(0, np.int64), before_end=np.zeros(0),
               after_start=np.zeros(0))
    return got


def match_partition(plan: Partitioning, k: int, launches: dict[str, Any] | None = None) -> Matched:
    """Partition ``k``'s launches (``read_partition``'s, given or read) sorted into instances:
    those the ranks launched differently left out (their keys kept), the others' facts. The
    launches stay where they were read (``Matched.launch``: their columns, and the rows of the
    instances' launches in instance order, then rank)."""
    got = read_partition(plan, k) if launches is None else launches
    mine = got.get("mine")  # (the rows of partition k, where others' were read too)

    def of(name: str) -> Any:
        return got[name] if mine is None else got[name][mine]

    width = plan.width
    group, seq, column = of("group"), of("seq"), of("column")
    order, key, unique_places = _sorted_by_instance(group, seq, column, width,
                                                    len(plan.group_keys))
    total = len(key)
    head = np.ones(total, dtype=bool)
    head[1:] = key[1:] != key[:-1]
    if not unique_places:
        in_order = column[order]
        twice = np.flatnonzero(~head[1:] & (in_order[1:] == in_order[:-1]))
        if len(twice):
            raise _twice(plan, int(key[twice[0]]), int(in_order[twice[0]]))
        del in_order
    unique = key[head]
    del key
    index = np.int32 if total < 1 << 31 else np.int64  # (row indices: half the memory)
    segment = np.cumsum(head, dtype=index)
    segment -= 1
    first = np.flatnonzero(head)
    del head
    count = len(unique)
    instance = np.empty(total, index)  # each row's instance, where it was read
    instance[order] = segment
    firsts = order[first]
    collective, size = of("collective"), of("size_bytes")
    conflict = np.zeros(count, bool)  # (in stretches: small passing arrays)
    for lo in range(0, total, 1 << 20):
        part = slice(lo, lo + (1 << 20))
        here = instance[part]
        disagree = collective[part] != np.take(collective[firsts], here)
        disagree |= size[part] != np.take(size[firsts], here)
        conflict[here[disagree]] = True
    not_kernel = np.zeros(count, bool)
    not_kernel[instance[~of("kernel")]] = True
    most_step = np.full(count, np.iinfo(np.int32).min, np.int32)
    np.maximum.at(most_step, instance, of("step"))

    valid = ~conflict
    kept = np.flatnonzero(valid)
    n = len(kept)
    if n == count:  # (every instance valid: the launches in instance order as sorted)
        rows, numbered = order, segment
    else:
        keep_launch = valid[segment]
        rows = order[keep_launch]
        numbered = (np.cumsum(valid, dtype=index) - 1)[segment[keep_launch]]
        del keep_launch
    del order, segment
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(numbered, minlength=n), out=offsets[1:])
    if mine is None and n == count:
        where = instance  # each row's valid instance (-1: none)
    else:
        where = np.full(len(got["seq"]), -1, index)
        if mine is not None:
            rows = mine[rows]
        where[rows] = numbered
    del numbered, instance
    launch = {name: got[name] for name in ("column", "start_us", "end_us", "site", "group",
                                           "seq", "first_row", "last_row", "span_column",
                                           "before_key", "before_end", "after_start")}
    launch.update(rows=rows, instance=where)
    return Matched(
        key=unique[kept], collective=collective[firsts[kept]], size_bytes=size[firsts[kept]],
        members=np.diff(offsets).astype(np.int32),
        needed=plan.group_size[unique[kept] >> SEQ_BITS].astype(np.int32),
        step=most_step[kept], dtype=of("dtype")[firsts[kept]], kernel=~not_kernel[kept],
        offsets=offsets, conflicts=unique[conflict], launch=launch)


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
                        groups: int) -> tuple[Any, Any, bool]:
    """The order that sorts launches by (group, seq, rank), each sorted launch's instance
    key, and whether no two launches share a place (known where they were placed: placed
    where the sequences are dense, ``_placed_by_instance``; else sorted)."""
    if len(seq) and (int(seq.min()) < 0 or int(seq.max()) >= 1 << SEQ_BITS):
        raise files.TraceError("a rows file holds a sequence number outside 0 .. 2^40")
    placed = _placed_by_instance(group, seq, column, width, groups)
    order = placed if placed is not None else _sort_by_instance(group, seq, column, width,
                                                                groups)
    key = group[order].astype(np.int64) << SEQ_BITS
    key |= seq[order]
    return order, key, placed is not None


def _placed_by_instance(group: Any, seq: Any, column: Any, width: int,
                        groups: int) -> Any:
    """The order of ``_sorted_by_instance`` with no sort, where a group's sequence is dense
    (as the job numbers it): each launch has a place of its own, its group's first place plus
    (its seq less the group's lowest) times the group's ranks present, plus its rank's
    position among them; the places, read in order, are the launches sorted. None where
    places would be sparse, or two launches take one (left to the sort, which says which)."""
    n = len(seq)
    if not n or width * groups > 4 * n + (1 << 20):
        return None
    pair = group.astype(np.int32 if groups * width < 1 << 31 else np.int64)
    pair *= width
    pair += column
    seen = np.zeros(groups * width, bool)  # (group, rank) pairs present
    seen[pair] = True
    present = np.flatnonzero(seen)
    del seen
    owner = present // width
    ranks = np.bincount(owner, minlength=groups).astype(np.int64)  # each group's present
    # each pair's position among its group's ranks present (read where present only)
    position = np.empty(groups * width, np.int32 if width < 1 << 31 else np.int64)
    position[present] = np.arange(len(present)) - np.repeat(
        np.concatenate([[0], np.cumsum(ranks)[:-1]]), ranks)
    del present, owner
    low = np.full(groups, 1 << SEQ_BITS, np.int64)
    high = np.full(groups, -1, np.int64)
    np.minimum.at(low, group, seq)
    np.maximum.at(high, group, seq)
    places = np.where(high >= low, high - low + 1, 0) * ranks
    total = int(places.sum())
    if total > 2 * n + (1 << 20):
        return None
    first = np.concatenate([[0], np.cumsum(places)[:-1]]) - low * ranks
    index = np.int32 if n < 1 << 31 else np.int64  # (row indices: half the memory)
    taken = np.full(total, -1, index)
    for lo in range(0, n, 1 << 20):  # (in stretches: small passing arrays)
        part = slice(lo, lo + (1 << 20))
        # the group's first place, (seq - its lowest) times its ranks present, then the
        # rank's position among them
        place = np.take(ranks, group[part])
        place *= seq[part]
        place += np.take(first, group[part])
        place += np.take(position, pair[part])
        taken[place] = np.arange(lo, lo + len(place), dtype=index)
    del pair
    order = taken[taken >= 0]
    return order if len(order) == n else None


def _sort_by_instance(group: Any, seq: Any, column: Any, width: int, groups: int) -> Any:
    """``_sorted_by_instance``'s order by sorting: one sort of one 64-bit key where the three
    fit in it; else a stable sort on (group, seq) of launches in rank order."""
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
    return order


# --- pass 2, continued: a partition's figures ---------------------------------------------------

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


def waits_of(start: Any, end: Any, next_start: Any, last: Any, transfer: Any) -> Any:
    """Each launch's wait: from its arrival to the last rank's, never more than its own time in
    the collective less the transfer; where only its entry is known, never more than until
    its next entry on its rank. (Each argument per launch.)"""
    waits = np.fmin(last, end - np.nan_to_num(transfer, nan=0.0)) - start
    bare = np.isnan(end) & ~np.isnan(next_start)
    waits[bare] = np.fmin(waits[bare], next_start[bare] - start[bare])
    np.maximum(waits, 0.0, out=waits)
    return waits


def figure_partition(plan: Partitioning, matched: Matched, shift: Any, heat: dict[str, Any],
                     keep_launches: bool = False) -> Figured:
    """Arrivals, straggler, skew, transfer and waits of each instance of a partition (clocks
    applied: ``shift`` per column), and the pieces the driver joins across partitions. The
    launches are taken in instance order (``Matched``'s rows: an instance's together, by
    rank), so each per-instance figure is a reduction over consecutive launches."""
    launch = matched.launch
    n = len(matched.key)
    width = plan.width
    if n == 0:
        z = np.zeros(0)
        return Figured(matched.key, z, z, np.zeros(0, np.int32), z, z, np.zeros(0, np.int32),
                       np.zeros(0, np.int64), {}, np.zeros(width), 0,
                       np.zeros((0, 3), np.int64), _no_cells(),
                       _kept(launch, matched.offsets, shift, np.zeros(len(launch["seq"])))
                       if keep_launches else None)
    _apply_clocks(launch, shift)
    rows, offsets = launch["rows"], matched.offsets  # (the launches, instance by instance)
    starts, members = offsets[:-1], np.diff(offsets)
    # each launch in instance order, then rank (``rows``): its arrival (its end and rank
    # taken where used, each array let go once used: a partition's launch-long arrays are
    # most of its memory)
    arrived = launch["start_us"][rows]
    first = np.minimum.reduceat(arrived, starts)
    last = np.maximum.reduceat(arrived, starts)
    index = np.int32 if len(rows) < 1 << 31 else np.int64
    # the straggler: the highest rank of those that arrived last (ranks in order within an
    # instance: its last such place); the first: the lowest of those that arrived first
    place = np.where(arrived == np.repeat(last, members), np.arange(len(rows), dtype=index),
                     index(-1))
    at_last = np.clip(np.maximum.reduceat(place, starts), 0, len(rows) - 1)
    scratch = np.repeat(first, members)
    place = np.where(arrived == scratch, np.arange(len(rows), dtype=index), index(len(rows)))
    at_first = np.clip(np.minimum.reduceat(place, starts), 0, len(rows) - 1)
    del place
    at_straggler, first_rows = rows[at_last], rows[at_first]
    straggler = launch["column"][at_straggler]
    skew = last - first
    transfer = launch["end_us"][at_straggler] - last
    group = (matched.key >> SEQ_BITS).astype(np.int64)
    seq = matched.key & ((1 << SEQ_BITS) - 1)
    pair = np.repeat(_narrow(group, int(group.max()) * width + width), members)  # (group, rank)
    pair *= width
    pair += launch["column"][rows]
    pairs, slot = _compact(pair)
    del pair
    reached = _furthest(pairs, slot, np.repeat(_narrow(seq, int(seq.max()) + 1), members),
                        width)
    # heat-map cells: how late each rank arrived, the most per (group, rank, step or bin)
    if heat["by_step"]:  # (x: the step + 1; 0: none known)
        x = matched.step.astype(np.int64) + 1
    else:
        low, span, bins = heat["seq_low"], heat["seq_span"], heat["bins"]
        x = (seq - low[group]) * bins[group] // np.maximum(span[group], 1)
    lateness = np.subtract(arrived, scratch, out=scratch)  # (``scratch``: each one's first)
    cells = _most_per_cell(pairs, slot, np.repeat(_narrow(x, int(heat["span"])), members),
                           heat["span"], lateness)
    del slot, lateness, scratch
    # each launch's wait (``waits_of``), in place: until the last arrival, never more than its
    # own time in the collective less the transfer, nor (by its entry alone) its next entry
    ended = launch["end_us"][rows]
    waits = np.repeat(np.nan_to_num(transfer, nan=0.0), members)
    np.subtract(ended, waits, out=waits)
    bare = np.flatnonzero(np.isnan(ended))
    del ended
    np.fmin(np.repeat(last, members), waits, out=waits)
    waits -= arrived
    if len(bare):
        following = next_start_of(launch, rows[bare])
        waits[bare] = np.where(np.isnan(following), waits[bare],
                               np.fmin(waits[bare], following - arrived[bare]))
    del arrived
    np.maximum(waits, 0.0, out=waits)
    total = np.add.reduceat(waits, starts)
    total += 0.0  # (as a sum from zero gives it: no -0.0)
    # per rank, added in the order of its rows (as they were read)
    wait_of = np.zeros(len(launch["seq"]))
    wait_of[rows] = waits
    valid = launch["instance"] >= 0
    whole = bool(valid.all())
    waited = np.bincount(launch["column"] if whole else launch["column"][valid],
                         weights=wait_of if whole else wait_of[valid], minlength=width)
    late = np.flatnonzero(skew >= IN_STEP_US)
    chain = {}
    for who, here in (("straggler", at_straggler[late]), ("first", first_rows[late])):
        chain[f"{who}_prev_key"], chain[f"{who}_prev_end"] = previous_of(launch, here)
        chain[f"{who}_start"] = launch["start_us"][here]
    return Figured(
        key=matched.key, last=last, skew=skew, straggler=straggler.astype(np.int32),
        transfer=transfer, total=total, straggler_site=launch["site"][at_straggler],
        late=late, chain=chain, waited=waited, bare=len(bare), reached=reached, cells=cells,
        launch=_kept(launch, matched.offsets, shift, wait_of) if keep_launches else None)


def _apply_clocks(launch: dict[str, Any], shift: Any) -> None:
    """Each rank's clock (``shift`` per column) taken out of its launches' times, in place:
    rank by rank, over each range of rows read (once: said in ``launch``)."""
    if launch.get("clocks") is not None or not shift.any():
        launch["clocks"] = shift
        return
    heads = np.flatnonzero(launch["first_row"]).tolist()
    tails = [*heads[1:], len(launch["first_row"])]
    start, end, column = launch["start_us"], launch["end_us"], launch["column"]
    for head, tail in zip(heads, tails, strict=True):
        by = float(shift[int(column[head])])
        if by:
            start[head:tail] -= by
            end[head:tail] -= by
    by = shift[launch["span_column"]]  # (the rows either side of each range, likewise)
    launch["before_end"] -= by
    launch["after_start"] -= by
    launch["clocks"] = shift


def _kept(launch: dict[str, Any], offsets: Any, shift: Any, wait: Any) -> dict[str, Any]:
    """What ``Analysis.launches_of`` reads of a partition's launches: the rows of each
    instance's launches (``rows`` from ``offsets``), their columns (clocks applied) and each
    row's wait."""
    _apply_clocks(launch, shift)
    return {"rows": launch["rows"], "offsets": offsets, "column": launch["column"],
            "start": launch["start_us"], "end": launch["end_us"], "site": launch["site"],
            "wait": wait}


def _narrow(values: Any, bound: int) -> Any:
    """``values`` (non-negative, under ``bound``) as 32-bit integers where they fit: half
    the memory of the launch-long arrays made of them."""
    return values.astype(np.int32 if bound < 1 << 31 else np.int64, copy=False)


def _furthest(pairs: Any, slot: Any, seq: Any, width: int) -> Any:
    """(group, column, highest seq) of each (group, column) pair present (``pairs``, each
    launch's in ``slot``), in pair order."""
    furthest = np.full(len(pairs), -1, seq.dtype)
    np.maximum.at(furthest, slot, seq)
    return np.stack([pairs // width, pairs % width, furthest], axis=1).astype(np.int64)


def _most_per_cell(pairs: Any, slot: Any, x: Any, span: int, value: Any) -> Any:
    """(cell keys, the most of each) where a cell's key is ``pair * span + x`` (each launch's
    pair a place in ``pairs``: ``slot``), in key order: in a table of the pairs present (no
    sort of the launches)."""
    cell = _narrow(slot, len(pairs) * span)  # (``slot`` is used up)
    cell *= span
    cell += x
    most = np.full(len(pairs) * span, -np.inf)
    np.maximum.at(most, cell, value)
    taken = np.flatnonzero(most != -np.inf)  # (the cells some launch fell in)
    return (pairs[taken // span] * span + taken % span, most[taken])


def _compact(values: Any) -> tuple[Any, Any]:
    """The distinct values of ``values`` (non-negative integers), sorted, and each one's place
    among them (32-bit where it fits): by a table of every value up to the largest where
    that is small, else by ``numpy.unique``."""
    if not len(values):
        return np.zeros(0, np.int64), np.zeros(0, np.int32)
    top = int(values.max()) + 1
    if top > 4 * len(values) + (1 << 20):
        distinct, place = np.unique(values, return_inverse=True)
        return distinct, place.astype(np.int32 if len(distinct) < 1 << 31 else np.int64)
    seen = np.zeros(top, bool)
    seen[values] = True
    distinct = np.flatnonzero(seen)
    del seen
    place = np.empty(top, np.int32 if len(distinct) < 1 << 31 else np.int64)  # (read where
    place[distinct] = np.arange(len(distinct))  # a value is only)
    return distinct, np.take(place, values)


def _no_cells() -> Any:
    return (np.zeros(0, np.int64), np.zeros(0))


def merge_cells(parts: list[tuple[Any, Any]]) -> Any:
    """(cell keys, the most of each) of several sets of cells; a cell's key is
    ``(group * width + column) * span + x``."""
    if len(parts) == 1:  # (one partition's: in key order, one each, already)
        return parts[0]
    key = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
    value = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0)
    if not len(key):
        return key, value
    order = np.argsort(key, kind="stable")
    key, value = key[order], value[order]
    heads = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    return key[heads], np.maximum.reduceat(value, heads)

"""Instances matched across thousands of ranks' rows with numpy: the same answers as
``skew.analyze`` (its rules: one instance per group and sequence position, every member rank
present and agreeing on the collective and its size; clocks fitted on GPU kernels' ends), with
no object per launch or instance and no instance x rank matrix — a job of 8,192 ranks in 1,024
tensor-parallel groups has a million instances, each on 8 ranks: its launches are kept as flat
arrays sorted by instance (16 million values each), not as 8 billion mostly empty cells.

Memory: the rows files are read one at a time into arrays allocated once (~50 bytes a launch),
then sorted once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from autoannot.traces import files
from autoannot.traces.rows import Rows, read
from autoannot.traces.skew import (
    IN_STEP_US,
    Analysis,
    ClockFit,
    Figures,
    Instance,
    disagreement,
    far_clocks_note,
    missing_ranks,
)

#: Problems listed one by one up to this many; the rest counted.
LISTED_PROBLEMS = 50
_SEQ_BITS = 40  # a key is group << 40 | seq


class Instances(Sequence[Instance]):
    """The instances of a ``RowsAnalysis``, made when asked for (a million would take seconds
    and hundreds of MB as objects)."""

    def __init__(self, figures: Figures, seq: Any, kernel: Any) -> None:
        self.figures, self.seq, self.kernel = figures, seq, kernel

    def __len__(self) -> int:
        return len(self.seq)

    @overload
    def __getitem__(self, index: int) -> Instance: ...
    @overload
    def __getitem__(self, index: slice) -> list[Instance]: ...

    def __getitem__(self, index: int | slice) -> Instance | list[Instance]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        f = self.figures
        group = int(f.group[index])
        return Instance(f.group_names[group], int(self.seq[index]),
                        f.collective_names[int(f.collective[index])], int(f.size_bytes[index]),
                        f.group_descs[group], index, kernel=bool(self.kernel[index]))

    def __iter__(self) -> Iterator[Instance]:
        return (self[i] for i in range(len(self)))


@dataclass
class RowsAnalysis(Analysis):
    """An ``Analysis`` whose launches are flat arrays sorted by instance, then rank
    (``offsets[i]:offsets[i + 1]`` are instance i's), and whose figures are arrays."""

    offsets: Any = None
    launch_column: Any = None
    launch_start: Any = None
    launch_end: Any = None
    launch_site: Any = None
    table: Figures | None = None
    site_names: Any = None
    ranks_figures: list[dict[str, Any]] | None = None

    def _segment(self, index: int) -> slice:
        return slice(int(self.offsets[index]), int(self.offsets[index + 1]))

    def _times(self, instance: Instance) -> list[tuple[int, float, float]]:
        part = self._segment(instance.index)
        ranks = self.ranks
        return [(ranks[int(c)], float(s), float(e)) for c, s, e in
                zip(self.launch_column[part], self.launch_start[part], self.launch_end[part],
                    strict=True)]

    def site(self, index: int, column: int) -> str | None:
        import numpy as np

        part = self._segment(index)
        columns = self.launch_column[part]
        at = int(np.searchsorted(columns, column))
        if at >= len(columns) or columns[at] != column:
            return None
        code = int(self.launch_site[part][at])
        return self.site_names[code] if code >= 0 else None

    def _parts(self, instance: Instance) -> list[tuple[int, float, str | None]]:
        """(rank, start, call site) of the ranks that took part, read from the instance's
        stretch of the arrays at once."""
        part = self._segment(instance.index)
        names, ranks = self.site_names, self.ranks
        return [(ranks[c], start, names[code] if code >= 0 else None)
                for c, start, code in zip(self.launch_column[part].tolist(),
                                          self.launch_start[part].tolist(),
                                          self.launch_site[part].tolist(), strict=True)]

    def launch_arrays(self) -> tuple[Any, Any, Any, Any]:
        import numpy as np

        counts = np.diff(self.offsets)
        return (np.repeat(np.arange(len(counts)), counts), self.launch_column,
                self.launch_start, self.launch_end)

    def figures(self) -> Figures:
        assert self.table is not None
        return self.table

    def summary_of(self, instance: Instance) -> tuple[int | None, float, float | None, float]:
        f, i = self.figures(), instance.index
        straggler = int(f.straggler[i])
        transfer = float(f.transfer[i])
        return (None if straggler < 0 else self.ranks[straggler], float(f.skew[i]),
                None if transfer != transfer else transfer, float(f.last[i]))

    def per_rank(self) -> list[dict[str, Any]]:
        assert self.ranks_figures is not None
        return self.ranks_figures


class _Launches:
    """Every rank's launches in arrays allocated once, filled one rows file at a time."""

    def __init__(self, total: int) -> None:
        import numpy as np

        self.group = np.empty(total, np.int64)
        self.seq = np.empty(total, np.int64)
        self.collective = np.empty(total, np.int32)
        self.size = np.empty(total, np.int64)
        self.start = np.empty(total, np.float64)
        self.end = np.empty(total, np.float64)
        self.site = np.empty(total, np.int32)
        self.kernel = np.empty(total, bool)
        self.column = np.empty(total, np.int32)


def analyze_rows(ranks_rows: list[Rows]) -> RowsAnalysis:
    """Instances, clocks and per-instance and per-rank figures of every rank's rows (read
    from their files here where they were read with ``rows.read_head``)."""
    import numpy as np

    ranks_rows = sorted(ranks_rows, key=lambda r: r.rank)
    ranks = [r.rank for r in ranks_rows]
    group_keys = sorted({str(g["name"]) for r in ranks_rows for g in r.groups})
    group_id = {name: i for i, name in enumerate(group_keys)}
    group_size = np.ones(len(group_keys), dtype=np.int64)
    group_desc = [""] * len(group_keys)
    collectives: dict[str, int] = {}
    sites: dict[str, int] = {}
    epochs = {r.base_ns if r.clock == "trace" else 0 for r in ranks_rows}
    if len(epochs) > 1 and None in epochs:
        raise files.TraceError("these rows count their times from different epochs, and some "
                               "from none known: their times cannot be lined up")
    origin = max(epochs) if len(epochs) > 1 else None  # type: ignore[type-var]
    launch = _Launches(sum(len(r) for r in ranks_rows))
    at = 0
    for column, rows in enumerate(ranks_rows):
        c = rows.columns
        if not c:  # (a head: its columns now, then let go)
            if rows.path is None:
                raise files.TraceError(f"rank {rows.rank}'s rows have no columns")
            c = read(rows.path, numpy=True).columns
            if len(c["seq"]) != len(rows):
                raise files.TraceError(f"{rows.path}: changed while it was read")
        for g in rows.groups:
            gid = group_id[str(g["name"])]
            group_size[gid] = max(int(group_size[gid]), int(g.get("size", 1)))
            group_desc[gid] = group_desc[gid] or str(g.get("desc", ""))
        here = slice(at, at + len(rows))
        at += len(rows)
        local_group = np.array([group_id[str(g["name"])] for g in rows.groups] or [0],
                               dtype=np.int64)
        # send and recv are one instance's two sides: compared as one
        local_collective = np.array(
            [collectives.setdefault("send/recv" if n in ("send", "recv") else n,
                                    len(collectives)) for n in rows.collectives] or [0],
            dtype=np.int32)
        local_site = np.array([sites.setdefault(s, len(sites)) for s in rows.sites] + [-1],
                              dtype=np.int32)  # (code -1 stays -1: no site)
        launch.group[here] = local_group[np.asarray(c["group"], dtype=np.intp)]
        launch.seq[here] = c["seq"]
        launch.collective[here] = local_collective[np.asarray(c["collective"], dtype=np.intp)]
        launch.size[here] = c["size_bytes"]
        launch.start[here] = c["start_us"]
        launch.end[here] = c["end_us"]
        if origin is not None:  # onto one epoch (rows of traces with other time bases)
            shift = ((rows.base_ns if rows.clock == "trace" else 0) - origin) / 1e3
            launch.start[here] += shift
            launch.end[here] += shift
        launch.site[here] = local_site[np.asarray(c["site"], dtype=np.intp)]
        launch.kernel[here] = c["kernel"]
        launch.column[here] = column
        del c
    return _match(launch, ranks, group_keys, group_size, group_desc, collectives, sites)


def _match(launch: _Launches, ranks: list[int], group_keys: list[str], group_size: Any,
           group_desc: list[str], collectives: dict[str, int],
           sites: dict[str, int]) -> RowsAnalysis:
    import numpy as np

    width = len(ranks)
    # one sort: by instance (group, seq), then rank
    order, instance_key = _sorted_by_instance(launch.group, launch.seq, launch.column, width,
                                              len(group_keys))
    del launch.group, launch.seq
    total = len(instance_key)
    head = np.ones(total, dtype=bool)
    head[1:] = instance_key[1:] != instance_key[:-1]
    unique = instance_key[head]
    del instance_key
    segment = np.cumsum(head) - 1  # each sorted launch's instance (all instances)
    first = np.flatnonzero(head)  # each instance's first sorted launch (its lowest rank)
    del head
    count = len(unique)
    members = np.bincount(segment, minlength=count)
    coll, size = launch.collective[order], launch.size[order]
    del launch.collective, launch.size
    disagree = (coll != coll[first][segment]) | (size != size[first][segment])
    conflict = np.bincount(segment, weights=disagree, minlength=count) > 0
    del disagree
    not_kernel = np.bincount(segment, weights=~launch.kernel[order], minlength=count) > 0
    del launch.kernel
    needed = group_size[unique >> _SEQ_BITS]
    valid = ~conflict & (members >= needed)
    problems = _problems(unique, conflict, members, needed, valid, group_keys)

    keep = order[valid[segment]]  # the valid instances' launches, in sorted order
    instance_of = (np.cumsum(valid) - 1)[segment[valid[segment]]]
    del order, segment
    column = launch.column[keep]
    start = launch.start[keep]
    end = launch.end[keep]
    site = launch.site[keep]
    del launch, keep
    n = int(valid.sum())
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(instance_of, minlength=n), out=offsets[1:])

    kept = np.flatnonzero(valid)
    first_kept = first[kept]
    table = Figures.empty(n)
    table.group = (unique[kept] >> _SEQ_BITS).astype(np.int32)
    table.collective = coll[first_kept]
    table.size_bytes = size[first_kept]
    table.members = np.diff(offsets).astype(np.int32)
    table.group_names, table.group_descs = group_keys, group_desc
    table.collective_names = [name for name, _ in sorted(collectives.items(),
                                                         key=lambda item: item[1])]
    seq = unique[kept] & ((1 << _SEQ_BITS) - 1)
    kernel_rows = ~not_kernel[kept]
    analysis = RowsAnalysis(Instances(table, seq, kernel_rows), [], problems, ranks)
    analysis.site_names = [s for s, _ in sorted(sites.items(), key=lambda item: item[1])]
    analysis.clocks = _fit_clocks(instance_of, column, end, kernel_rows, n, ranks)
    note = far_clocks_note(analysis)
    if note:
        analysis.notes.append(note)
    shift = np.array([fit.offset_us if fit.applied else 0.0 for fit in analysis.clocks])
    if shift.any():
        start -= shift[column]
        end -= shift[column]
    analysis.offsets, analysis.launch_column = offsets, column
    analysis.launch_start, analysis.launch_end, analysis.launch_site = start, end, site
    analysis.table = table
    _figures(analysis, instance_of, width)
    return analysis


def _sorted_by_instance(group: Any, seq: Any, column: Any, width: int,
                        groups: int) -> tuple[Any, Any]:
    """The order that sorts launches by (group, seq, rank), and each sorted launch's instance
    key (group << 40 | seq). One sort of one 64-bit key where group, seq and rank fit in it
    (e.g. 2^20 groups, 2^26 collectives a rank and 2^17 ranks); else a stable sort on (group,
    seq), the launches being in rank order already."""
    import numpy as np

    if len(seq) and (int(seq.min()) < 0 or int(seq.max()) >= 1 << _SEQ_BITS):
        raise files.TraceError("a rows file holds a sequence number outside 0 .. 2^40")
    seq_bits = max(1, int(seq.max()).bit_length()) if len(seq) else 1
    rank_bits = max(1, (width - 1).bit_length())
    group_bits = max(1, (groups - 1).bit_length())
    if group_bits + seq_bits + rank_bits <= 63:
        composite = (group << (seq_bits + rank_bits)) | (seq << rank_bits) | column
        order = np.argsort(composite)
        del composite
    else:
        order = np.argsort((group << _SEQ_BITS) | seq, kind="stable")
    return order, (group[order] << _SEQ_BITS) | seq[order]


def _problems(unique: Any, conflict: Any, members: Any, needed: Any, valid: Any,
              groups: list[str]) -> list[str]:
    import numpy as np

    problems: list[str] = []
    bad = np.flatnonzero(~valid)
    for index in bad[:LISTED_PROBLEMS]:
        group = groups[int(unique[index] >> _SEQ_BITS)]
        seq = int(unique[index] & ((1 << _SEQ_BITS) - 1))
        if conflict[index]:
            problems.append(disagreement(group, seq, "on the collective or its size"))
        else:
            problems.append(missing_ranks(group, seq, int(needed[index] - members[index]),
                                          int(needed[index])))
    if len(bad) > LISTED_PROBLEMS:
        problems.append(f"... and {len(bad) - LISTED_PROBLEMS} more instances not matched")
    return problems


def _fit_clocks(instance_of: Any, column: Any, end: Any, kernel_rows: Any, n: int,
                ranks: list[int]) -> list[ClockFit]:
    """As ``skew._fit_clocks``: each rank's offset from the first rank's, the median of its
    kernels' end times minus the first rank's over the instances both took part in; applied
    where it stands out of its spread."""
    import numpy as np

    if not ranks:
        return []
    reference = np.full(n, np.nan)
    mine = column == 0
    reference[instance_of[mine]] = end[mine]
    estimate = end - reference[instance_of]
    usable = kernel_rows[instance_of] & ~mine & ~np.isnan(estimate)
    by_rank = column[usable]
    estimate = estimate[usable]
    del usable, reference
    order = np.argsort(by_rank, kind="stable")
    by_rank, estimate = by_rank[order], estimate[order]
    bounds = np.searchsorted(by_rank, np.arange(len(ranks) + 1))
    fits = [ClockFit(ranks[0], 0.0, 0.0, 0, False)]
    for c in range(1, len(ranks)):
        values = estimate[bounds[c]:bounds[c + 1]]
        if not len(values):
            fits.append(ClockFit(ranks[c], 0.0, 0.0, 0, False))
            continue
        offset = float(np.median(values))
        spread = float(np.median(np.abs(values - offset)))
        fits.append(ClockFit(ranks[c], offset, spread, len(values),
                             abs(offset) > max(1.0, 3 * spread)))
    return fits


def _figures(analysis: RowsAnalysis, instance_of: Any, width: int) -> None:
    """Each instance's straggler, skew, transfer and last arrival, and each rank's waits, in
    whole-array steps."""
    import numpy as np

    table = analysis.table
    assert table is not None
    start, end, column = analysis.launch_start, analysis.launch_end, analysis.launch_column
    n = len(table.group)
    if n == 0:
        analysis.ranks_figures = [{"rank": r, "waited_us": 0.0, "others_waited_for_it_us": 0.0,
                                   "last_to_arrive": 0} for r in analysis.ranks]
        return
    heads = analysis.offsets[:-1]
    first = np.minimum.reduceat(start, heads)
    last = np.maximum.reduceat(start, heads)
    # the straggler: the last to arrive, the highest rank among equals (as skew.summary_of)
    arrived_last = start == last[instance_of]
    straggler = np.maximum.reduceat(np.where(arrived_last, column, -1), heads)
    del arrived_last
    at_straggler = column == straggler[instance_of]
    straggler_end = np.full(n, np.nan)
    straggler_end[instance_of[at_straggler]] = end[at_straggler]
    del at_straggler
    skew = last - first
    late = skew >= IN_STEP_US
    waits = last[instance_of] - start
    waited = np.bincount(column, weights=waits, minlength=width)
    total = np.add.reduceat(waits, heads)
    del waits
    caused = np.bincount(straggler[late], weights=total[late], minlength=width)
    times_late = np.bincount(straggler[late], minlength=width)
    table.skew, table.last = skew, last
    table.transfer = straggler_end - last
    table.straggler = np.where(late, straggler, -1).astype(np.int32)
    analysis.ranks_figures = [
        {"rank": r, "waited_us": round(float(waited[c]), 3),
         "others_waited_for_it_us": round(float(caused[c]), 3),
         "last_to_arrive": int(times_late[c])} for c, r in enumerate(analysis.ranks)]

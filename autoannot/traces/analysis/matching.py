"""The one analysis: every rank's launches matched into collective instances across ranks, and
what each instance says — who arrived last, how long each rank waited, what the transfer took,
where a delay began — in whole-array steps (numpy), with no object per launch or instance.

An *instance* is one collective on the member ranks of its process group: the same group, the
same position in that group's sequence. Rules: every rank present agrees on the collective and
its size (else the instance is left out, named); an instance some member ranks left no record
of is lined up on the ranks present, and the missing ranks are named per group (``missing``);
clocks are fitted on GPU kernels' ends only.

Scale: a job of 8,192 ranks in 1,024 tensor-parallel groups has a million instances, each on 8
ranks: its launches are kept as flat arrays sorted by instance (16 million values each), not
as 8 billion mostly empty cells. Every reader (traces, record files, rows) gives launches in
one table (``rows.Rows``, a column each); this module is the only matcher.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from autoannot.traces import files
from autoannot.traces.table.rows import Rows, from_launches, read

#: Below this, arrivals count as simultaneous: no straggler is named.
IN_STEP_US = 2.0
#: Problems listed one by one up to this many; the rest counted.
LISTED_PROBLEMS = 50
_SEQ_BITS = 40  # a key is group << 40 | seq


@dataclass
class Instance:
    """One collective on all its ranks; its figures are in ``Analysis.figures()``."""

    group: str
    seq: int
    collective: str
    size_bytes: int
    group_desc: str
    index: int  # its row in the figures
    kernel: bool = False  # every rank's part timed by a GPU kernel (ends fit clocks)


@dataclass
class ClockFit:
    rank: int
    offset_us: float  # this rank's clock minus the reference rank's
    spread_us: float  # median absolute deviation of the per-instance estimates
    instances: int
    applied: bool


@dataclass
class Figures:
    """Per instance, as numpy arrays: its group and collective (codes into the name lists),
    size, member ranks present and the group's size, profiler step (-1: none known), skew,
    straggler (a column of ``Analysis.ranks``; -1: in step), transfer (NaN: unknown), last
    arrival, the lateness carried from the straggler's previous
    collective, the instance where the delay began (``cause``; -1: none), the wait blamed on
    this instance as a cause, and whether it is warm-up (left out of the ranking)."""

    group: Any
    collective: Any
    size_bytes: Any
    members: Any
    skew: Any
    straggler: Any
    transfer: Any
    last: Any
    needed: Any = None
    step: Any = None
    carried: Any = None
    cause: Any = None
    blame: Any = None
    warmup: Any = None
    dtype: Any = None  # codes into ``dtype_names``
    dtype_names: list[str] = field(default_factory=list)
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


class Instances(Sequence[Instance]):
    """The instances of an ``Analysis``, made when asked for (a million would take seconds
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
class Analysis:
    """The instances and their figures; the launches as flat arrays sorted by instance, then
    rank (``offsets[i]:offsets[i + 1]`` are instance i's)."""

    instances: Sequence[Instance]
    clocks: list[ClockFit]
    problems: list[str] = field(default_factory=list)  # what could not be matched, and why
    ranks: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what to keep in mind (not a failure)
    #: Groups whose ranks did not all leave a record, or did not all reach its last instance.
    missing: list[dict[str, Any]] = field(default_factory=list)
    offsets: Any = None
    launch_column: Any = None
    launch_start: Any = None
    launch_end: Any = None
    launch_site: Any = None
    launch_wait: Any = None
    seq: Any = None
    table: Figures | None = None
    site_names: Any = None
    ranks_figures: list[dict[str, Any]] | None = None
    #: Whether warm-up instances count in the ranking (``include_warmup``).
    warmup_counted: bool = False

    def _segment(self, index: int) -> slice:
        return slice(int(self.offsets[index]), int(self.offsets[index + 1]))

    def figures(self) -> Figures:
        assert self.table is not None
        return self.table

    def site(self, index: int, column: int) -> str | None:
        """The call site of rank ``ranks[column]``'s part in instance ``index``."""
        import numpy as np

        part = self._segment(index)
        columns = self.launch_column[part]
        at = int(np.searchsorted(columns, column))
        if at >= len(columns) or columns[at] != column:
            return None
        code = int(self.launch_site[part][at])
        return self.site_names[code] if code >= 0 else None

    def _parts(self, instance: Instance) -> list[tuple[int, float, float, str | None]]:
        """(rank, start, wait, call site) of the ranks that took part."""
        part = self._segment(instance.index)
        names, ranks = self.site_names, self.ranks
        return [(ranks[c], start, wait, names[code] if code >= 0 else None)
                for c, start, wait, code in zip(self.launch_column[part].tolist(),
                                                self.launch_start[part].tolist(),
                                                self.launch_wait[part].tolist(),
                                                self.launch_site[part].tolist(), strict=True)]

    def summary_of(self, instance: Instance) -> tuple[int | None, float, float | None, float]:
        """(straggler or None when in step, skew, transfer or None, last arrival)."""
        f, i = self.figures(), instance.index
        straggler = int(f.straggler[i])
        transfer = float(f.transfer[i])
        return (None if straggler < 0 else self.ranks[straggler], float(f.skew[i]),
                None if transfer != transfer else transfer, float(f.last[i]))

    def largest_skews(self, top: int) -> list[Instance]:
        """The ``top`` instances of largest skew, largest first (warm-up left out unless
        counted)."""
        import numpy as np

        f = self.figures()
        skew = np.where(f.warmup & ~self.warmup_counted, -1.0, f.skew)
        head = (np.argpartition(-skew, top)[:top] if top < len(skew)
                else np.arange(len(skew)))
        head = np.sort(head)  # (ties: in instance order)
        head = head[np.argsort(-skew[head], kind="stable")]
        return [self.instances[int(i)] for i in head if skew[i] >= 0]

    def cause_of(self, index: int) -> dict[str, Any] | None:
        """Where the delay at instance ``index`` began: its rank, instance and call site."""
        f = self.figures()
        root = int(f.cause[index])
        if root < 0:
            return None
        one = self.instances[root]
        column = int(f.straggler[root])
        return {"rank": self.ranks[column], "group": one.group, "seq": one.seq,
                "collective": one.collective, "step": int(f.step[root]),
                "call_site": self.site(root, column)}

    def origins(self, top: int = 20) -> list[dict[str, Any]]:
        """Where delays began, by the others' wait blamed on each (warm-up left out unless
        counted): rank, instance, call site, blamed wait, how late it arrived there."""
        import numpy as np

        f = self.figures()
        blamed = np.flatnonzero(f.blame > 0)
        blamed = blamed[np.argsort(-f.blame[blamed], kind="stable")][:top]
        found = []
        for index in blamed.tolist():
            one = self.instances[index]
            column = int(f.straggler[index])
            found.append({"rank": self.ranks[column], "group": one.group,
                          "group_desc": one.group_desc, "seq": one.seq,
                          "collective": one.collective, "step": int(f.step[index]),
                          "call_site": self.site(index, column),
                          "blamed_us": round(float(f.blame[index]), 3),
                          "late_us": round(float(f.skew[index] - f.carried[index]), 3)})
        return found

    def row(self, instance: Instance) -> dict[str, Any]:
        from autoannot.traces.units import bus_factor

        f, i = self.figures(), instance.index
        straggler, skew, transfer, _ = self.summary_of(instance)
        parts = self._parts(instance)
        busbw = None
        if transfer and transfer > 0 and instance.size_bytes:
            busbw = instance.size_bytes / (transfer * 1e-6) / 1e9 * bus_factor(
                instance.collective, len(parts))
        return {
            "group": instance.group, "group_desc": instance.group_desc, "seq": instance.seq,
            "collective": instance.collective, "size_bytes": instance.size_bytes,
            "dtype": f.dtype_names[int(f.dtype[i])] if f.dtype_names else "",
            "step": int(f.step[i]), "warmup": bool(f.warmup[i]),
            "straggler": straggler, "skew_us": round(skew, 3),
            "transfer_us": None if transfer is None else round(transfer, 3),
            "busbw_gbps": None if busbw is None else round(busbw, 3),
            "carried_us": round(float(f.carried[i]), 3), "cause": self.cause_of(i),
            "ranks": {str(rank): {"start_us": round(start, 3), "wait_us": round(wait, 3),
                                  "call_site": site}
                      for rank, start, wait, site in parts},
        }

    def rows(self) -> list[dict[str, Any]]:
        return [self.row(instance) for instance in self.instances]

    def per_rank(self) -> list[dict[str, Any]]:
        """Per rank: time waiting in collectives, and the others' wait blamed on it."""
        assert self.ranks_figures is not None
        return self.ranks_figures


def disagreement(group: str, seq: int, how: str) -> str:
    """The problem of an instance its ranks launched differently."""
    return f"group {group}, collective #{seq}: the ranks disagree ({how}): not matched"


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


def analyze(per_rank: dict[int, list[Any]], include_warmup: bool = False) -> Analysis:
    """Instances across ranks, from each rank's launches (``launch.Launch``): put in one table
    (a ``Rows`` a rank), then matched as rows are."""
    return analyze_rows([from_launches(launches, rank) for rank, launches in per_rank.items()],
                        include_warmup)


class _Launches:
    """Every rank's launches in arrays allocated once, filled one rows file at a time."""

    def __init__(self, total: int) -> None:
        import numpy as np

        self.group = np.empty(total, np.int32)
        self.seq = np.empty(total, np.int64)
        self.collective = np.empty(total, np.int32)
        self.size = np.empty(total, np.int64)
        self.start = np.empty(total, np.float64)
        self.end = np.empty(total, np.float64)
        self.site = np.empty(total, np.int32)
        self.kernel = np.empty(total, bool)
        self.column = np.empty(total, np.int32)
        self.step = np.empty(total, np.int32)
        self.dtype = np.empty(total, np.int16)


def analyze_rows(ranks_rows: list[Rows], include_warmup: bool = False) -> Analysis:
    """Instances, clocks and per-instance and per-rank figures of every rank's rows (read
    from their files here where they were read with ``rows.read_head``)."""
    import numpy as np

    ranks_rows = sorted(ranks_rows, key=lambda r: r.rank)
    ranks = [r.rank for r in ranks_rows]
    group_keys = sorted({str(g["name"]) for r in ranks_rows for g in r.groups})
    group_id = {name: i for i, name in enumerate(group_keys)}
    group_size = np.ones(len(group_keys), dtype=np.int64)
    group_desc = [""] * len(group_keys)
    group_members: list[tuple[int, ...] | None] = [None] * len(group_keys)
    collectives: dict[str, int] = {}
    sites: dict[str, int] = {}
    dtypes: dict[str, int] = {}
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
            full = read(rows.path, numpy=True)
            c = full.columns
            if len(c["seq"]) != len(rows) or len(full.groups) != len(rows.groups):
                raise files.TraceError(f"{rows.path}: changed while it was read")
            rows = full  # (its string tables: the head's, extended by what the file adds)
        for g in rows.groups:
            gid = group_id[str(g["name"])]
            group_size[gid] = max(int(group_size[gid]), int(g.get("size", 1)))
            group_desc[gid] = group_desc[gid] or str(g.get("desc", ""))
            if isinstance(g.get("ranks"), list) and group_members[gid] is None:
                group_members[gid] = tuple(int(r) for r in g["ranks"])
        here = slice(at, at + len(rows))
        at += len(rows)
        local_group = np.array([group_id[str(g["name"])] for g in rows.groups] or [0],
                               dtype=np.int32)
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
        launch.step[here] = c["step"]
        local_dtype = np.array([dtypes.setdefault(d, len(dtypes)) for d in rows.dtypes] or [0],
                               dtype=np.int16)
        launch.dtype[here] = local_dtype[np.asarray(c["dtype"], dtype=np.intp)]
        launch.column[here] = column
        del c
    analysis = _match(launch, ranks, group_keys, group_size, group_desc, group_members,
                      collectives, sites, include_warmup)
    analysis.figures().dtype_names = [d for d, _ in sorted(dtypes.items(),
                                                           key=lambda item: item[1])]
    return analysis


def _match(launch: _Launches, ranks: list[int], group_keys: list[str], group_size: Any,
           group_desc: list[str], group_members: list[tuple[int, ...] | None],
           collectives: dict[str, int], sites: dict[str, int],
           include_warmup: bool = False) -> Analysis:
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
    segment = np.cumsum(head, dtype=np.int64) - 1  # each sorted launch's instance
    first = np.flatnonzero(head)  # each instance's first sorted launch (its lowest rank)
    del head
    count = len(unique)
    coll, size = launch.collective[order], launch.size[order]
    del launch.collective, launch.size
    disagree = (coll != coll[first][segment]) | (size != size[first][segment])
    conflict = np.bincount(segment, weights=disagree, minlength=count) > 0
    del disagree
    not_kernel = np.bincount(segment, weights=~launch.kernel[order], minlength=count) > 0
    del launch.kernel
    needed = group_size[unique >> _SEQ_BITS]
    # An instance some ranks have no record of is lined up on the ranks present (the missing
    # ones are named: ``missing``); one the ranks launched differently is left out.
    valid = ~conflict
    members = np.bincount(segment, minlength=count)
    problems = _problems(unique, conflict, valid & (members < needed), members, needed,
                         group_keys)

    kept_launch = valid[segment]
    keep = order[kept_launch]  # the valid instances' launches, in sorted order
    del order
    index_type = np.int32 if len(unique) < 2**31 else np.int64
    instance_of = (np.cumsum(valid, dtype=np.int64) - 1).astype(index_type)[segment[kept_launch]]
    del segment, kept_launch
    column = launch.column[keep]
    start = launch.start[keep]
    end = launch.end[keep]
    site = launch.site[keep]
    step = launch.step[keep]
    dtype = launch.dtype[keep]
    # (the caller holds ``launch``: its columns go here, not with the name)
    del launch.column, launch.start, launch.end, launch.site, launch.step, launch.dtype
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
    table.needed = needed[kept].astype(np.int32)
    table.step = (np.maximum.reduceat(step, offsets[:-1]) if n else np.zeros(0, np.int32))
    table.dtype = dtype[offsets[:-1]] if n else np.zeros(0, np.int32)
    del coll, size, step, dtype  # (per launch: no longer needed)
    table.group_names, table.group_descs = group_keys, group_desc
    table.collective_names = [name for name, _ in sorted(collectives.items(),
                                                         key=lambda item: item[1])]
    seq = unique[kept] & ((1 << _SEQ_BITS) - 1)
    kernel_rows = ~not_kernel[kept]
    analysis = Analysis(Instances(table, seq, kernel_rows), [], problems, ranks,
                        warmup_counted=include_warmup)
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
    analysis.seq = seq
    analysis.missing = _missing(analysis, instance_of, group_keys, group_size, group_desc,
                                group_members)
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
        composite = group.astype(np.int64) << (seq_bits + rank_bits)
        composite |= seq << rank_bits
        composite |= column
        order = np.argsort(composite)
        del composite
    else:
        order = np.argsort((group.astype(np.int64) << _SEQ_BITS) | seq, kind="stable")
    key = group[order].astype(np.int64) << _SEQ_BITS
    key |= seq[order]
    return order, key


def _problems(unique: Any, conflict: Any, partial: Any, members: Any, needed: Any,
              groups: list[str]) -> list[str]:
    """The instances the ranks launched differently, one by one (up to ``LISTED_PROBLEMS``);
    those some member ranks have no record of, one line per group (they are lined up on the
    ranks present)."""
    import numpy as np

    problems: list[str] = []
    bad = np.flatnonzero(conflict)
    for index in bad[:LISTED_PROBLEMS]:
        group = groups[int(unique[index] >> _SEQ_BITS)]
        seq = int(unique[index] & ((1 << _SEQ_BITS) - 1))
        problems.append(disagreement(group, seq, "on the collective or its size"))
    if len(bad) > LISTED_PROBLEMS:
        problems.append(f"... and {len(bad) - LISTED_PROBLEMS} more instances the ranks "
                        "disagree on")
    short = np.flatnonzero(partial)
    for group_code in np.unique(unique[short] >> _SEQ_BITS).tolist():
        mine = short[(unique[short] >> _SEQ_BITS) == group_code]
        seqs = (unique[mine] & ((1 << _SEQ_BITS) - 1)).tolist()
        size = int(needed[mine[0]])
        fewest = int(members[mine].min())
        shown = ", ".join(f"#{s}" for s in seqs[:5]) + (", ..." if len(seqs) > 5 else "")
        problems.append(
            f"group {groups[group_code]}: {count(len(seqs), 'collective')} ({shown}) some of "
            f"its {size} ranks have no trace or record of (down to {fewest} present): lined up "
            "on the ranks present")
    return problems


def _missing(analysis: Analysis, instance_of: Any, group_keys: list[str], group_size: Any,
             group_desc: list[str],
             group_members: list[tuple[int, ...] | None]) -> list[dict[str, Any]]:
    """Per group whose ranks did not all leave a record of it, or did not all reach its last
    instance: the ranks with no record at all, and the last instance each present rank
    reached (a hang's shape: the ranks stuck in one collective, the rank that never came)."""
    import numpy as np

    table, ranks, seq = analysis.table, analysis.ranks, analysis.seq
    assert table is not None
    found: list[dict[str, Any]] = []
    if not len(table.group):
        return found
    # a group whose last instance every member reached is whole: only the others are read
    # (instances are in (group, seq) order)
    last = np.flatnonzero(np.r_[table.group[1:] != table.group[:-1], True])
    short = table.group[last[table.members[last] < table.needed[last]]]
    if not len(short):
        return found
    mine = np.flatnonzero(np.isin(table.group[instance_of], short))
    column = analysis.launch_column[mine]
    instance_of = instance_of[mine]
    group_of_launch = table.group[instance_of]
    order = np.lexsort((seq[instance_of], column, group_of_launch))
    g_sorted, c_sorted = group_of_launch[order], column[order]
    last_of = np.ones(len(order), dtype=bool)  # the last launch of each (group, rank)
    last_of[:-1] = (g_sorted[1:] != g_sorted[:-1]) | (c_sorted[1:] != c_sorted[:-1])
    reached: dict[int, dict[int, int]] = {}  # group -> rank -> its last instance there
    for g, c, i in zip(g_sorted[last_of].tolist(), c_sorted[last_of].tolist(),
                       instance_of[order][last_of].tolist(), strict=True):
        reached.setdefault(g, {})[ranks[c]] = i
    present = set(ranks)
    for g, by_rank in sorted(reached.items(), key=lambda item: natural_key(group_keys[item[0]])):
        size = int(group_size[g])
        members = group_members[g]
        if members is not None:
            absent = [r for r in members if r not in present or r not in by_rank]
            unknown_absent = 0
        else:
            absent, unknown_absent = [], max(0, size - len(by_rank))
        furthest = max(int(seq[i]) for i in by_rank.values())
        behind = {r: i for r, i in by_rank.items() if int(seq[i]) < furthest}
        if not absent and not unknown_absent and not behind:
            continue
        ahead = sorted(r for r, i in by_rank.items() if int(seq[i]) == furthest)
        top = next(i for r, i in by_rank.items() if int(seq[i]) == furthest)
        found.append({
            "group": group_keys[g], "group_desc": group_desc[g], "size": size,
            "members": None if members is None else list(members),
            "no_record": absent, "no_record_unknown": unknown_absent,
            "reached": {"ranks": ahead, "seq": furthest,
                        "collective": table.collective_names[int(table.collective[top])],
                        "step": int(table.step[top])},
            "behind": [{"rank": r, "seq": int(seq[i]),
                        "collective": table.collective_names[int(table.collective[i])]}
                       for r, i in sorted(behind.items())]})
    return found


def describe_missing(entry: dict[str, Any]) -> str:
    """One line naming a group's missing ranks, furthest behind first: 'group 0 (default_pg):
    rank 3 left no record; ranks 0-2 reached broadcast #13', 'rank 3's last launch was
    allreduce #8 (it never entered #9)'."""
    reached = entry["reached"]
    name = f"group {entry['group']}" + (f" ({entry['group_desc']})" if entry["group_desc"]
                                         else "")
    said = []
    if entry["no_record"]:
        said.append(f"{rank_list(entry['no_record'])} left no record")
    if entry["no_record_unknown"]:
        said.append(f"{entry['no_record_unknown']} of its {entry['size']} ranks left no record "
                    "(the inputs do not name the group's ranks)")
    for one in sorted(entry["behind"], key=lambda b: (b["seq"], b["rank"])):
        said.append(f"rank {one['rank']}'s last launch was {one['collective']} #{one['seq']} "
                    f"(it never entered #{one['seq'] + 1})")
    said.append(f"{rank_list(reached['ranks'])} reached {reached['collective']} "
                f"#{reached['seq']}")
    return f"{name}: " + "; ".join(said)


def rank_list(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0-2', 'ranks 0, 2 and 5'."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    shown = [str(r) for r in ranks[:8]] + ([f"{len(ranks) - 8} more"] if len(ranks) > 8 else [])
    return f"ranks {', '.join(shown[:-1])} and {shown[-1]}"


def count(number: int, noun: str) -> str:
    """'1 trace', '3 traces'."""
    return f"{number} {noun}" + ("" if number == 1 else "s")


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key of a name with numbers in it: tp2 before tp10."""
    import re

    return tuple(int(part) if part.isdigit() else part
                 for part in re.split(r"(\d+)", name))


def _fit_clocks(instance_of: Any, column: Any, end: Any, kernel_rows: Any, n: int,
                ranks: list[int]) -> list[ClockFit]:
    """Each rank's offset from the first rank's, the median of its
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


def _figures(analysis: Analysis, instance_of: Any, width: int) -> None:
    """Each instance's straggler, skew, transfer, last arrival and cause, each launch's wait,
    and each rank's totals, in whole-array steps.

    A rank's wait at an instance is the time from its arrival to the last rank's, but never
    more than its own time in the collective less the transfer (a rank that leaves early, as
    gloo's broadcast lets it, does not wait there: it waits at its next collective). Where
    only entry times are known, its time in the collective is at most until it entered its
    next one: the waits are upper bounds there (said in a note).

    Blame: the last rank's lateness at an instance is its own (new) or carried over from its
    previous collective, which it left later than the first rank to arrive left its own
    (``carried``: the difference of the two exits, at most the skew, and at most how late the
    previous collective itself was). The others' waits are
    split in that proportion: the new part is blamed on this instance's last rank at its call
    site, the carried part on whatever caused the previous collective's lateness (followed
    back to where the delay began), so a delay travelling through a chain of collectives is
    blamed once, where it started."""
    import numpy as np

    table = analysis.table
    assert table is not None
    start, end, column = analysis.launch_start, analysis.launch_end, analysis.launch_column
    n = len(table.group)
    table.cause = np.full(n, -1, dtype=np.int64)
    table.carried = np.zeros(n)
    table.blame = np.zeros(n)
    table.warmup = np.zeros(n, dtype=bool)
    if n == 0:
        analysis.launch_wait = np.zeros(len(start))
        analysis.ranks_figures = [{"rank": r, "waited_us": 0.0, "others_waited_for_it_us": 0.0,
                                   "last_to_arrive": 0} for r in analysis.ranks]
        return
    heads = analysis.offsets[:-1]
    first = np.minimum.reduceat(start, heads)
    last = np.maximum.reduceat(start, heads)
    # the straggler: the last to arrive, the highest rank among equals; the first: the lowest
    straggler = np.maximum.reduceat(np.where(start == last[instance_of], column, -1), heads)
    at_straggler = np.flatnonzero(column == straggler[instance_of])  # a launch per instance
    first_column = np.minimum.reduceat(np.where(start == first[instance_of], column, width),
                                       heads)
    at_first = np.flatnonzero(column == first_column[instance_of])
    straggler_end = end[at_straggler]
    skew = last - first
    transfer = straggler_end - last
    late = skew >= IN_STEP_US
    # waits, bounded by each rank's own time in the collective less the transfer
    # (min(last arrival, own end - transfer) - start, in two arrays' room)
    bound = np.nan_to_num(transfer, nan=0.0)[instance_of]
    np.subtract(end, bound, out=bound)  # NaN where only the entry is known: bounded below
    waits = last[instance_of]
    np.fmin(waits, bound, out=waits)
    del bound
    waits -= start
    # each rank's launches in its own time order (a stable sort by rank, whose blocks are a
    # few runs already in time order, one per group: then a merge of those runs)
    index_type = np.int32 if len(start) < 2**31 else np.int64
    by_rank = np.argsort(column, kind="stable")
    if index_type is np.int32:
        by_rank = by_rank.astype(np.int32)
    low = float(start.min()) if len(start) else 0.0
    span = float(start.max()) - low + 1.0 if len(start) else 1.0
    key = column[by_rank] * span
    key += start[by_rank]
    key -= low
    by_time = by_rank[np.argsort(key, kind="stable")]
    del by_rank, key
    position = np.empty(len(start), dtype=index_type)
    position[by_time] = np.arange(len(start), dtype=index_type)
    timeline = {"by_time": by_time, "position": position}  # (let go once the causes are known)
    del by_time, position
    entries_only = bool(np.isnan(end).any())

    def neighbour(launch: Any, step: int) -> Any:
        """The launch before (-1) or after (+1) each of ``launch`` on its rank; -1: none."""
        by_time = timeline["by_time"]
        at = timeline["position"][launch].astype(np.int64) + step
        inside = (at >= 0) & (at < len(by_time))
        found = np.full(len(launch), -1, dtype=np.int64)
        found[inside] = by_time[at[inside]]
        found[found >= 0] = np.where(column[found[found >= 0]] == column[launch[found >= 0]],
                                     found[found >= 0], -1)
        return found

    if entries_only:  # known by entry alone: in it at most until its next entry
        bare = np.flatnonzero(np.isnan(end))
        after = neighbour(bare, +1)
        bounded = after >= 0
        waits[bare[bounded]] = np.fmin(waits[bare[bounded]],
                                       start[after[bounded]] - start[bare[bounded]])
        analysis.notes.append(
            f"{len(bare)} launches are known by their entry times alone (record files): there "
            "is no transfer time for them, and their waits are bounded by the rank's next "
            "entry only (upper bounds)")
    np.maximum(waits, 0.0, out=waits)
    analysis.launch_wait = waits
    total = np.add.reduceat(waits, heads)
    # warm-up: the first profiler step (ProfilerStep#0), and each group's first collective
    table.warmup = (table.step == 0) | (analysis.seq == 0)

    def left(launch: Any) -> Any:
        """When each of ``launch`` left its collective: its end; where only its entry is known,
        the last arrival (no collective ends before it), or its next launch's entry where that
        came first (it had left: a gloo broadcast's receivers may)."""
        when = end[launch].copy()
        bare = np.isnan(when)
        if bare.any():
            after = neighbour(launch[bare], +1)
            nxt = np.where(after >= 0, start[np.maximum(after, 0)], np.nan)
            when[bare] = np.fmin(last[instance_of[launch[bare]]], nxt)
        return when

    before_last, before_first = neighbour(at_straggler, -1), neighbour(at_first, -1)
    known = (before_last >= 0) & (before_first >= 0) & late
    carried = np.zeros(n)
    # (no more than the previous collective was itself held up: a rank that simply has more
    # to do between its collectives is late by itself, not by what came before)
    came_from = instance_of[before_last[known]]
    carried[known] = np.clip(left(before_last[known]) - left(before_first[known]), 0.0,
                             np.minimum(skew[known], skew[came_from]))
    timeline.clear()
    # the cause of each late instance: its own straggler, or the cause of the instance the
    # straggler came from where most of its lateness was carried from there
    parent = np.arange(n)
    inherits = known & (carried > skew - carried)
    parent[inherits] = instance_of[before_last[inherits]]
    root = parent
    while True:  # follow each chain back to where it began (pointer jumping)
        further = root[root]
        if np.array_equal(further, root):
            break
        root = further
    share = np.where(late, carried / np.where(skew > 0, skew, 1.0), 0.0)
    counted = late & (~table.warmup | analysis.warmup_counted)
    blame = np.bincount(np.flatnonzero(counted), weights=(total * (1 - share))[counted],
                        minlength=n)
    carried_to = np.where(known, root[instance_of[np.maximum(before_last, 0)]], -1)
    moved = counted & (carried_to >= 0)
    if not analysis.warmup_counted:  # (a delay that began in warm-up is warm-up's)
        moved &= ~table.warmup[np.maximum(carried_to, 0)]
    blame += np.bincount(carried_to[moved], weights=(total * share)[moved], minlength=n)
    table.skew, table.last = skew, last
    table.transfer = transfer
    table.straggler = np.where(late, straggler, -1).astype(np.int32)
    table.cause = np.where(late, root, -1)
    table.carried = carried
    table.blame = blame
    waited = np.bincount(column, weights=waits, minlength=width)
    caused = np.bincount(straggler[blame > 0], weights=blame[blame > 0], minlength=width)
    times_late = np.bincount(straggler[counted], minlength=width)
    analysis.ranks_figures = [
        {"rank": r, "waited_us": round(float(waited[c]), 3),
         "others_waited_for_it_us": round(float(caused[c]), 3),
         "last_to_arrive": int(times_late[c])} for c, r in enumerate(analysis.ranks)]

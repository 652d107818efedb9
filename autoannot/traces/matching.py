"""Instances matched across thousands of ranks' rows with numpy: the same answers as
``skew.analyze`` (its rules: one instance per group and sequence position, every member rank
present and agreeing on the collective and its size; clocks fitted on GPU kernels' ends), with
no object per launch and no instance x rank matrix — a job of 8,192 ranks in 1,024
tensor-parallel groups has a million instances, each on 8 ranks: its launches are kept as flat
arrays sorted by instance (16 million values each), not as 8 billion mostly empty cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoannot.traces.rows import Rows
from autoannot.traces.skew import IN_STEP_US, Analysis, ClockFit, Instance, far_clocks_note

#: Problems listed one by one up to this many; the rest counted.
LISTED_PROBLEMS = 50
_SEQ_BITS = 40  # a key is group << 40 | seq


@dataclass
class RowsAnalysis(Analysis):
    """An ``Analysis`` whose launches are flat arrays sorted by instance, then rank
    (``offsets[i]:offsets[i + 1]`` are instance i's)."""

    offsets: Any = None
    launch_column: Any = None
    launch_start: Any = None
    launch_end: Any = None
    launch_site: Any = None

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

    def launch_arrays(self) -> tuple[Any, Any, Any, Any]:
        import numpy as np

        counts = np.diff(self.offsets)
        return (np.repeat(np.arange(len(counts)), counts), self.launch_column,
                self.launch_start, self.launch_end)


def analyze_rows(ranks_rows: list[Rows]) -> RowsAnalysis:
    """Instances, clocks and per-instance and per-rank figures of every rank's rows."""
    import numpy as np

    ranks_rows = sorted(ranks_rows, key=lambda r: r.rank)
    ranks = [r.rank for r in ranks_rows]
    width = len(ranks)
    groups = sorted({str(g["name"]) for r in ranks_rows for g in r.groups})
    group_id = {name: i for i, name in enumerate(groups)}
    group_size = np.ones(len(groups), dtype=np.int64)
    group_desc = [""] * len(groups)
    collectives: dict[str, int] = {}
    sites: dict[str, int] = {}
    parts: dict[str, list[Any]] = {k: [] for k in ("group", "seq", "collective", "size",
                                                   "start", "end", "site", "kernel")}
    lengths = []
    for rows in ranks_rows:
        c = rows.columns
        for g in rows.groups:
            gid = group_id[str(g["name"])]
            group_size[gid] = max(int(group_size[gid]), int(g.get("size", 1)))
            group_desc[gid] = group_desc[gid] or str(g.get("desc", ""))
        local_group = np.array([group_id[str(g["name"])] for g in rows.groups] or [0],
                               dtype=np.int64)
        # send and recv are one instance's two sides: compared as one
        local_collective = np.array(
            [collectives.setdefault("send/recv" if n in ("send", "recv") else n,
                                    len(collectives)) for n in rows.collectives] or [0],
            dtype=np.int32)
        local_site = np.array([sites.setdefault(s, len(sites)) for s in rows.sites] + [-1],
                              dtype=np.int32)  # (code -1 stays -1: no site)
        parts["group"].append(local_group[np.asarray(c["group"], dtype=np.int64)])
        parts["seq"].append(np.asarray(c["seq"], dtype=np.int64))
        parts["collective"].append(local_collective[np.asarray(c["collective"], dtype=np.int64)])
        parts["size"].append(np.asarray(c["size_bytes"], dtype=np.int64))
        parts["start"].append(np.asarray(c["start_us"], dtype=np.float64))
        parts["end"].append(np.asarray(c["end_us"], dtype=np.float64))
        parts["site"].append(local_site[np.asarray(c["site"], dtype=np.int64)])
        parts["kernel"].append(np.asarray(c["kernel"], dtype=bool))
        lengths.append(len(rows))
    launch: dict[str, Any] = {}
    for name in list(parts):
        launch[name] = np.concatenate(parts.pop(name)) if lengths else np.zeros(0, np.int64)
    launch["column"] = np.repeat(np.arange(width, dtype=np.int32), lengths)

    # one sort: by instance (group, seq), then rank
    order, instance_key = _sorted_by_instance(launch.pop("group"), launch.pop("seq"),
                                              launch["column"], width, len(groups))
    for name in list(launch):
        launch[name] = launch[name][order]
    del order
    total = len(instance_key)
    head = np.ones(total, dtype=bool)
    head[1:] = instance_key[1:] != instance_key[:-1]
    unique = instance_key[head]
    del instance_key
    segment = np.cumsum(head) - 1  # each launch's instance (all instances)
    first = np.flatnonzero(head)  # each instance's first launch (its lowest rank)
    del head
    count = len(unique)
    members = np.bincount(segment, minlength=count)
    coll, size = launch.pop("collective"), launch.pop("size")
    disagree = (coll != coll[first][segment]) | (size != size[first][segment])
    conflict = np.bincount(segment, weights=disagree, minlength=count) > 0
    not_kernel = np.bincount(segment, weights=~launch.pop("kernel"), minlength=count) > 0
    del disagree
    needed = group_size[unique >> _SEQ_BITS]
    valid = ~conflict & (members >= needed)
    problems = _problems(unique, conflict, members, needed, valid, groups)

    keep = valid[segment]
    instance_of = (np.cumsum(valid) - 1)[segment[keep]]
    del segment
    column = launch["column"][keep]
    start = launch["start"][keep]
    end = launch["end"][keep]
    site = launch["site"][keep]
    del launch, keep
    n = int(valid.sum())
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(instance_of, minlength=n), out=offsets[1:])

    names = {i: name for name, i in collectives.items()}
    kept = np.flatnonzero(valid)
    kernel_rows = ~not_kernel[kept]
    instances = [Instance(groups[int(k >> _SEQ_BITS)], int(k & ((1 << _SEQ_BITS) - 1)),
                          names[int(coll[f])], int(size[f]),
                          group_desc[int(k >> _SEQ_BITS)], row, kernel=bool(timed))
                 for row, (k, f, timed) in enumerate(zip(unique[kept].tolist(),
                                                         first[kept].tolist(),
                                                         kernel_rows.tolist(), strict=True))]
    analysis = RowsAnalysis(instances, [], problems, ranks)
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
    _precompute(analysis, instance_of)
    return analysis


def _sorted_by_instance(group: Any, seq: Any, column: Any, width: int,
                       groups: int) -> tuple[Any, Any]:
    """The order that sorts launches by (group, seq, rank), and each sorted launch's instance
    key (group << 40 | seq). One sort of one 64-bit key where group, seq and rank fit in it
    (they do for any job seen: 2^20 groups, 2^26 collectives a rank, 2^17 ranks); else a
    stable sort on (group, seq), the launches being in rank order already."""
    import numpy as np

    if len(seq) and (int(seq.min()) < 0 or int(seq.max()) >= 1 << _SEQ_BITS):
        raise ValueError("a sequence number outside 0 .. 2^40")
    seq_bits = max(1, int(seq.max()).bit_length()) if len(seq) else 1
    rank_bits = max(1, (width - 1).bit_length())
    group_bits = max(1, (groups - 1).bit_length())
    key = (group << _SEQ_BITS) | seq
    if group_bits + seq_bits + rank_bits <= 63:
        order = np.argsort((group << (seq_bits + rank_bits)) | (seq << rank_bits) | column)
    else:
        order = np.argsort(key, kind="stable")
    return order, key[order]


def _problems(unique: Any, conflict: Any, members: Any, needed: Any, valid: Any,
              groups: list[str]) -> list[str]:
    import numpy as np

    problems: list[str] = []
    bad = np.flatnonzero(~valid)
    for index in bad[:LISTED_PROBLEMS]:
        group = groups[int(unique[index] >> _SEQ_BITS)]
        seq = int(unique[index] & ((1 << _SEQ_BITS) - 1))
        if conflict[index]:
            problems.append(f"group {group}, collective #{seq}: the ranks disagree (on the "
                            "collective or its size): not matched")
        else:
            absent = int(needed[index] - members[index])
            problems.append(f"group {group}, collective #{seq}: {absent} of its "
                            f"{int(needed[index])} ranks have no trace or record of it: left out")
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


def _precompute(analysis: RowsAnalysis, instance_of: Any) -> None:
    """Each instance's straggler, skew, transfer and last arrival, and each rank's waits, in
    whole-array steps (``Analysis.summary_of`` and ``per_rank`` then read them)."""
    import numpy as np

    start, end, column = analysis.launch_start, analysis.launch_end, analysis.launch_column
    n, width = len(analysis.instances), len(analysis.ranks)
    if n == 0:
        analysis.precomputed = ([], [{"rank": r, "waited_us": 0.0,
                                      "others_waited_for_it_us": 0.0, "last_to_arrive": 0}
                                     for r in analysis.ranks])
        return
    heads = analysis.offsets[:-1]
    first = np.minimum.reduceat(start, heads)
    last = np.maximum.reduceat(start, heads)
    # the straggler: the last to arrive, the highest rank among equals (as skew.summary_of)
    arrived_last = start == last[instance_of]
    straggler = np.maximum.reduceat(np.where(arrived_last, column, -1), heads)
    at_straggler = column == straggler[instance_of]
    straggler_end = np.full(n, np.nan)
    straggler_end[instance_of[at_straggler]] = end[at_straggler]
    skew = last - first
    late = skew >= IN_STEP_US
    waits = last[instance_of] - start
    waited = np.bincount(column, weights=waits, minlength=width)
    total = np.add.reduceat(waits, heads)
    del waits
    caused = np.bincount(straggler[late], weights=total[late], minlength=width)
    times_late = np.bincount(straggler[late], minlength=width)
    ranks = analysis.ranks
    transfer = straggler_end - last
    summaries = [((ranks[c] if is_late else None), s, None if t != t else t, a)
                 for c, is_late, s, t, a in zip(straggler.tolist(), late.tolist(),
                                                skew.tolist(), transfer.tolist(),
                                                last.tolist(), strict=True)]
    per_rank = [{"rank": r, "waited_us": round(float(waited[c]), 3),
                 "others_waited_for_it_us": round(float(caused[c]), 3),
                 "last_to_arrive": int(times_late[c])} for c, r in enumerate(ranks)]
    analysis.precomputed = (summaries, per_rank)

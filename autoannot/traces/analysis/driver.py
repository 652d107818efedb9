"""The driver's part of the analysis: what needs every instance at once, joined from the
partitions' small results (``partitions.Matched``, ``partitions.Figured``) — the instances'
facts, where each delay began (cause chains), the blame, each rank's figures, the ranks that
left no record — and the ``Analysis`` they make. An instance's launches stay in their
partition, read again when a renderer asks (``launches_of_partition``, ``rank_launches``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoannot.traces import names
from autoannot.traces.analysis import partitions as parts
from autoannot.traces.analysis.partitions import SEQ_BITS, Partitioning
from autoannot.traces.analysis.results import (
    Analysis,
    Figures,
    Instances,
    far_clocks_note,
)


@dataclass
class Joined:
    """The valid instances of every partition, in partition order (each in (group, seq)
    order): their facts, each partition's first (``bases``), the keys left out for a
    disagreement (sorted), and the order that sorts the keys (None: they are in order, as
    partitions cut by key give them)."""

    key: Any
    collective: Any
    size_bytes: Any
    members: Any
    needed: Any
    step: Any
    dtype: Any
    kernel: Any
    bases: Any
    conflicts: Any
    by_key: Any

    @property
    def keys(self) -> tuple[Any, Any]:
        """The keys sorted, and the order that sorts them (None: as they are)."""
        return (self.key, None) if self.by_key is None else (self.key[self.by_key],
                                                             self.by_key)

    def in_key_order(self, positions: Any) -> Any:
        """The instances at ``positions`` of the keys sorted."""
        return positions if self.by_key is None else self.by_key[positions]

    def sorted_by_key(self, values: Any) -> Any:
        """Per-instance ``values`` in the order of the keys sorted."""
        return values if self.by_key is None else values[self.by_key]


def join_matched(matched: list[parts.Matched]) -> Joined:
    """The instances of every partition, in partition order."""
    found = {name: np.concatenate([getattr(m, name) for m in matched])
             for name in ("key", "collective", "size_bytes", "members", "needed", "step",
                          "dtype", "kernel")}
    key = found["key"]
    in_order = len(key) < 2 or bool(np.all(key[1:] > key[:-1]))
    return Joined(**found, bases=np.concatenate([[0], np.cumsum([len(m.key) for m in matched])]),
                  conflicts=np.sort(np.concatenate([m.conflicts for m in matched])),
                  by_key=None if in_order else np.argsort(key, kind="stable"))


@dataclass
class Gathered:
    """The partitions' figures end to end (per instance; per late instance what the cause
    chains need; per rank the waits; each rank's furthest instance per group; the heat map's
    cells)."""

    last: Any
    skew: Any
    straggler: Any
    transfer: Any
    total: Any
    straggler_site: Any
    late_at: Any  # the late instances (skew >= IN_STEP_US), numbered over every partition
    chain: dict[str, Any]
    bare: int
    waited: Any
    reached: Any
    cells: Any


def gather_figures(figured: list[parts.Figured], bases: Any, width: int) -> Gathered:
    """Every partition's figures, end to end."""
    def joined(name: str) -> Any:
        return np.concatenate([getattr(f, name) for f in figured])

    chain = {name: np.concatenate([f.chain[name] for f in figured if f.chain])
             if any(f.chain for f in figured) else np.zeros(0)
             for name in ("straggler_prev_key", "straggler_prev_end", "straggler_start",
                          "first_prev_key", "first_prev_end", "first_start")}
    return Gathered(
        last=joined("last"), skew=joined("skew"),
        straggler=joined("straggler").astype(np.int32, copy=False), transfer=joined("transfer"),
        total=joined("total"), straggler_site=joined("straggler_site"),
        late_at=np.concatenate([f.late + bases[k] for k, f in enumerate(figured)]),
        chain=chain, bare=sum(f.bare for f in figured),
        waited=np.sum([f.waited for f in figured], axis=0) if figured else np.zeros(width),
        reached=joined("reached"), cells=parts.merge_cells([f.cells for f in figured]))


@dataclass
class Causes:
    """Where each late instance's delay began. Of the late instances whose straggler's and
    first rank's previous collectives are known (``here``, in order): the instance the
    straggler came from (``source``) and the lateness it carried in from there
    (``carried_here``); per instance, that lateness (``carried``, 0 elsewhere) and where
    its delay began (``cause``: itself, or the cause of the instance its lateness came
    from; -1 where it is not late)."""

    here: Any
    source: Any
    carried_here: Any
    carried: Any
    cause: Any

    def root_of(self, instances: Any) -> Any:
        """Where the delay of each of ``instances`` began (itself, where it is not late)."""
        found = self.cause[instances]
        return np.where(found >= 0, found, instances)


def cause_chains(g: Gathered, keys: tuple[Any, Any]) -> Causes:
    """Where each late instance's delay began: the lateness its straggler carried in from
    its previous collective — how much later it left that one than the first rank to
    arrive left its own — and, where most of its lateness was carried, the cause of the
    instance it came from (followed back by pointer jumping over those instances alone)."""
    n, last, skew, chain = len(g.skew), g.last, g.skew, g.chain
    came_from = lookup(keys, chain["straggler_prev_key"].astype(np.int64))
    first_from = lookup(keys, chain["first_prev_key"].astype(np.int64))
    known_late = (came_from >= 0) & (first_from >= 0)

    def left(end: Any, instance: Any, start: Any) -> Any:
        """When a previous launch left its collective: its end; where only its entry is
        known, the last arrival there, or the next launch's entry where that came first."""
        return np.where(np.isnan(end), np.fmin(last[np.maximum(instance, 0)], start), end)

    here = g.late_at[known_late]
    source = came_from[known_late]
    carried_here = np.clip(
        left(chain["straggler_prev_end"][known_late], source,
             chain["straggler_start"][known_late])
        - left(chain["first_prev_end"][known_late], first_from[known_late],
               chain["first_start"][known_late]),
        0.0, np.minimum(skew[here], skew[source]))
    carried = np.zeros(n)
    carried[here] = carried_here
    cause = np.full(n, -1, np.int64)
    cause[g.late_at] = g.late_at
    inherits = carried_here > skew[here] - carried_here
    heirs, target = here[inherits], source[inherits]  # (heirs: in order)
    # pointer jumping: each heir's furthest known ancestor, and where that one is an heir
    # too, its place among the heirs (-1: not one: the ancestor is where the delay began)
    at = np.minimum(np.searchsorted(heirs, target), max(len(heirs) - 1, 0))
    further = np.where(heirs[at] == target, at, -1) if len(heirs) else at
    for _ in range(max(1, len(heirs)).bit_length() + 1):  # (chains run back in time)
        going = further >= 0
        if not going.any():
            break
        step = np.where(going, further, 0)
        target = np.where(going, target[step], target)
        further = np.where(going, further[step], -1)
    cause[heirs] = target
    return Causes(here, source, carried_here, carried, cause)


def blame_of(g: Gathered, causes: Causes, late: Any, counted: Any, warmup: Any,
             warmup_counted: bool) -> Any:
    """Per instance, the waiting it caused: each counted late instance's total wait, its own
    share where its straggler was late of itself, the carried share moved to where that
    delay began (not to warm-up, unless warm-up counts)."""
    here, skew = causes.here, g.skew
    blame = np.where(counted, g.total, 0.0)
    share = causes.carried_here / np.where(skew[here] > 0, skew[here], 1.0)
    mine = counted[here]
    blame[here[mine]] = (g.total[here] * (1 - share))[mine]
    carried_to = causes.root_of(causes.source)
    moved = mine
    if not warmup_counted:  # (a delay that began in warm-up is warm-up's)
        moved = moved & ~warmup[carried_to]
    to, weights = carried_to[moved], (g.total[here] * share)[moved]
    if len(to):  # (added in instance order, as one bincount over every instance would)
        targets, slot = np.unique(to, return_inverse=True)
        blame[targets] += np.bincount(slot, weights=weights, minlength=len(targets))
    return blame


def rank_figures(g: Gathered, blame: Any, counted: Any, ranks: list[int]) -> list[dict[str, Any]]:
    """Per rank: its waiting, the waiting it caused, the times it came last (counted)."""
    width = len(ranks)
    caused = np.bincount(g.straggler[blame > 0], weights=blame[blame > 0], minlength=width)
    times_late = np.bincount(g.straggler[counted], minlength=width)
    return [{"rank": r, "waited_us": round(float(g.waited[c]), 3),
             "others_waited_for_it_us": round(float(caused[c]), 3),
             "last_to_arrive": int(times_late[c])} for c, r in enumerate(ranks)]


#: Said where some launches are known by their entry times alone.
BARE = ("{bare} launches are known by their entry times alone (record files, rings): there is no "
        "transfer time for them, and their waits are bounded by the rank's next entry only "
        "(upper bounds)")


def build(plan: Partitioning, joined: Joined, figured: list[parts.Figured], fits: list[Any],
          include_warmup: bool, window_starts: Any = None) -> Analysis:
    """The ``Analysis`` of every partition's instances and figures. Warm-up: profiler step
    0 and each group's first instance; where no step is known, also the instances at
    ``window_starts`` (each rank's first of a group in its inputs)."""
    g = gather_figures(figured, joined.bases, plan.width)
    seq = joined.key & ((1 << SEQ_BITS) - 1)
    table = Figures(
        (joined.key >> SEQ_BITS).astype(np.int32), joined.collective, joined.size_bytes,
        joined.members, g.skew, g.straggler, g.transfer, g.last, needed=joined.needed,
        step=joined.step, dtype=joined.dtype, group_names=plan.group_keys,
        group_descs=plan.group_desc, collective_names=plan.collective_names,
        dtype_names=plan.dtype_names)
    table.warmup = (table.step == 0) | (seq == 0)
    if window_starts is not None and len(window_starts):
        table.warmup |= (table.step < 0) & np.isin(joined.key, window_starts)
    late = g.skew >= parts.IN_STEP_US
    causes = cause_chains(g, joined.keys)
    counted = late & (~table.warmup | include_warmup)
    blame = blame_of(g, causes, late, counted, table.warmup, include_warmup)
    table.straggler = np.where(late, g.straggler, -1).astype(np.int32)
    table.cause = causes.cause
    table.carried, table.blame = causes.carried, blame
    analysis = Analysis(
        Instances(table, seq, joined.kernel), fits, problems_of(plan, joined), plan.ranks,
        warmup_counted=include_warmup, seq=seq, table=table, site_names=plan.site_names,
        ranks_figures=rank_figures(g, blame, counted, plan.ranks), plan=plan,
        bases=joined.bases, straggler_column=g.straggler, straggler_site=g.straggler_site,
        cells=g.cells, heat=plan.heat, keys=joined.keys,
        read_partition=functools.partial(launches_of_partition, plan))
    note = far_clocks_note(analysis)
    if note:
        analysis.notes.append(note)
    if g.bare:
        analysis.notes.append(BARE.format(bare=g.bare))
    if len(figured) == 1 and figured[0].launch is not None:
        analysis.keep_partition(0, figured[0].launch)
    # (last: it reads the analysis's instances and, for a rank behind, its call site)
    analysis.missing = missing_ranks(analysis, plan, joined, g.reached)
    if analysis.missing:
        hang_of(analysis, plan, joined, g.reached)
    analysis.mismatches = mismatches(plan, joined, analysis)
    return analysis


def hang_of(analysis: Any, plan: Partitioning, joined: Joined, reached: Any) -> None:
    """The wait-for analysis (``hang``) of what each rank last entered on each group (its
    furthest instance: ``reached``), into ``analysis.hang_lead`` and ``analysis.hang``."""
    from autoannot.traces.analysis import hang
    from autoannot.traces.analysis.results import rank_list

    order = np.lexsort((reached[:, 2], reached[:, 1], reached[:, 0]))
    reached = reached[order]
    ends = np.flatnonzero(np.r_[(reached[1:, 0] != reached[:-1, 0])
                                | (reached[1:, 1] != reached[:-1, 1]), True])
    ranks = analysis.ranks
    entered: dict[int, dict[int, int]] = {}
    for g, c, s in reached[ends].tolist():
        entered.setdefault(g, {})[ranks[c]] = s
    table = analysis.table
    seq = analysis.seq
    first = np.full(len(plan.group_keys), 1 << SEQ_BITS, np.int64)
    np.minimum.at(first, table.group, seq)
    finished = np.full(len(plan.group_keys), -1, np.int64)  # (its straggler's part ended)
    ended = ~np.isnan(table.transfer)
    np.maximum.at(finished, table.group[ended], seq[ended])
    groups = [hang.GroupProgress(plan.group_keys[g], plan.group_desc[g],
                                 int(plan.group_size[g]), plan.group_members[g], by_rank,
                                 int(first[g]) if first[g] < 1 << SEQ_BITS else 0,
                                 int(finished[g]))
              for g, by_rank in sorted(entered.items())]
    found = hang.wait_for(groups)
    if found is None:
        return
    code = {name: g for g, name in enumerate(plan.group_keys)}
    column = {r: c for c, r in enumerate(ranks)}

    parts_of: dict[int, dict[str, Any]] = {}  # (an instance's launches: read once)

    def describe(group: str, seq: int, rank: int) -> hang.Launch | None:
        i = int(lookup(joined.keys, np.array([(code[group] << SEQ_BITS) | seq]))[0])
        if i < 0:
            return None
        launch = parts_of.get(i)
        if launch is None:
            launch = parts_of[i] = analysis.launches_of(i)
        at = np.flatnonzero(launch["column"] == column[rank])
        start = float(launch["start"][at[0]]) if len(at) else None
        return hang.Launch(table.collective_names[int(table.collective[i])],
                           analysis.site(i, column[rank]) if len(at) else site_of(analysis, i),
                           int(table.step[i]), start)

    analysis.hang_lead = hang.lines(found, groups, describe, rank_list)
    analysis.hang = hang.as_json(found, groups, describe)


def mismatches(plan: Partitioning, joined: Joined, analysis: Any) -> list[str]:
    """A line for each of the first few instances the ranks launched differently (another
    collective, size or dtype at one place of a group's sequence): which ranks launched
    what, read from their rows."""
    from autoannot.traces.analysis.results import LISTED_PROBLEMS, rank_list
    from autoannot.traces.units import size_text

    keys = joined.conflicts[:LISTED_PROBLEMS]
    if not len(keys):
        return []
    said = []
    by_partition: dict[int, list[int]] = {}
    for key in keys.tolist():
        k = int(plan.part_of(np.array([key >> SEQ_BITS]), np.array([key & ((1 << SEQ_BITS)
                                                                          - 1)]))[0])
        by_partition.setdefault(k, []).append(key)
    for k, wanted in sorted(by_partition.items()):
        got = parts.read_partition(plan, k)
        key = (got["group"].astype(np.int64) << SEQ_BITS) | got["seq"]
        for one in wanted:
            rows = np.flatnonzero(key == one)
            kinds: dict[tuple[str, int, str], list[int]] = {}
            for row in rows.tolist():
                kind = (plan.collective_names[int(got["collective"][row])],
                        int(got["size_bytes"][row]),
                        plan.dtype_names[int(got["dtype"][row])] if plan.dtype_names else "")
                kinds.setdefault(kind, []).append(analysis.ranks[int(got["column"][row])])
            group = plan.group_keys[one >> SEQ_BITS]
            desc = plan.group_desc[one >> SEQ_BITS]
            launched = "; ".join(
                f"{rank_list(sorted(ranks))} launched {name} ({size_text(size)}"
                + (f", {dtype}" if dtype else "") + ")"
                for (name, size, dtype), ranks in sorted(kinds.items(), key=lambda i: i[1]))
            said.append(f"MISMATCH: group {names.group_label(group, desc)}"
                        + f" #{one & ((1 << SEQ_BITS) - 1)}: {launched}: one collective's "
                        "ranks must launch the same collective, size and dtype (the job hangs "
                        "or fails there)")
    return said


def lookup(keys: tuple[Any, Any], wanted: Any) -> Any:
    """The instance of each key ``wanted``; -1 where there is none (no valid instance).
    ``keys``: the instances' keys sorted, and the order that sorts them (None: in order)."""
    sorted_keys, order = keys
    if not len(sorted_keys):
        return np.full(len(wanted), -1, np.int64)
    at = np.minimum(np.searchsorted(sorted_keys, wanted), len(sorted_keys) - 1)
    return np.where(sorted_keys[at] == wanted, at if order is None else order[at], -1)


def problems_of(plan: Partitioning, joined: Joined) -> list[str]:
    """The instances the ranks launched differently, one by one (up to ``LISTED_PROBLEMS``);
    those some member ranks have no record of, one line per group."""
    from autoannot.traces.analysis.results import LISTED_PROBLEMS, count, disagreement

    problems: list[str] = []
    bad = joined.conflicts
    for key in bad[:LISTED_PROBLEMS].tolist():
        problems.append(disagreement(plan.group_keys[key >> SEQ_BITS],
                                     key & ((1 << SEQ_BITS) - 1),
                                     "on the collective or its size"))
    if len(bad) > LISTED_PROBLEMS:
        problems.append(f"... and {len(bad) - LISTED_PROBLEMS} more instances the ranks "
                        "disagree on")
    short = joined.in_key_order(np.flatnonzero(
        joined.sorted_by_key(joined.members < joined.needed)))
    keys = joined.key[short]
    for group_code in np.unique(keys >> SEQ_BITS).tolist():
        mine = short[(keys >> SEQ_BITS) == group_code]
        seqs = (joined.key[mine] & ((1 << SEQ_BITS) - 1)).tolist()
        size = int(joined.needed[mine[0]])
        fewest = int(joined.members[mine].min())
        shown = ", ".join(f"#{s}" for s in seqs[:5]) + (", ..." if len(seqs) > 5 else "")
        problems.append(
            f"group {plan.group_keys[group_code]}: {count(len(seqs), 'collective')} ({shown}) "
            f"some of its {size} ranks have no trace or record of (down to {fewest} present): "
            "lined up on the ranks present")
    return problems


def missing_ranks(analysis: Any, plan: Partitioning, joined: Joined,
             reached: Any) -> list[dict[str, Any]]:
    """Per group whose ranks did not all leave a record of it, or did not all reach its last
    instance: the ranks with no record at all, and the last instance each present rank
    reached (a hang's shape: the ranks stuck in one collective, the rank that never came)."""
    from autoannot.traces.analysis.results import natural_key

    table, ranks = analysis.table, analysis.ranks
    found: list[dict[str, Any]] = []
    if not len(table.group):
        return found
    # a group whose last instance every member reached is whole: only the others are read
    group_sorted = joined.sorted_by_key(table.group)
    last = joined.in_key_order(np.flatnonzero(np.r_[group_sorted[1:] != group_sorted[:-1],
                                                    True]))
    short = set(table.group[last[table.members[last] < table.needed[last]]].tolist())
    if not short:
        return found
    # each rank's furthest instance in each short group (the most over the partitions)
    reached = reached[np.isin(reached[:, 0], list(short))]
    order = np.lexsort((reached[:, 2], reached[:, 1], reached[:, 0]))
    reached = reached[order]
    ends = np.flatnonzero(np.r_[(reached[1:, 0] != reached[:-1, 0])
                                | (reached[1:, 1] != reached[:-1, 1]), True])
    reached = reached[ends]
    instance = lookup(joined.keys, (reached[:, 0] << SEQ_BITS) | reached[:, 2])
    by_group: dict[int, dict[int, int]] = {}
    for g, c, i in zip(reached[:, 0].tolist(), reached[:, 1].tolist(), instance.tolist(),
                       strict=True):
        by_group.setdefault(g, {})[ranks[c]] = i
    seq = analysis.seq
    present = set(ranks)
    column = {r: c for c, r in enumerate(ranks)}
    for g, by_rank in sorted(by_group.items(),
                             key=lambda item: natural_key(plan.group_keys[item[0]])):
        size = int(plan.group_size[g])
        members = plan.group_members[g]
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
        following = lookup(joined.keys, np.array(
            [(g << SEQ_BITS) | (int(seq[i]) + 1) for i in behind.values()], np.int64))
        after = dict(zip(behind, following.tolist(), strict=True))
        found.append({
            "group": plan.group_keys[g], "group_desc": plan.group_desc[g], "size": size,
            "members": None if members is None else list(members),
            "no_record": absent, "no_record_unknown": unknown_absent,
            "reached": {"ranks": ahead, "seq": furthest,
                        "collective": table.collective_names[int(table.collective[top])],
                        "step": int(table.step[top]), "call_site": site_of(analysis, top)},
            "behind": [{"rank": r, "seq": int(seq[i]),
                        "collective": table.collective_names[int(table.collective[i])],
                        "call_site": analysis.site(i, column[r]),
                        "next": None if after[r] < 0 else {
                            "collective": table.collective_names[
                                int(table.collective[after[r]])],
                            "call_site": site_of(analysis, after[r])}}
                       for r, i in sorted(behind.items())]})
    return found


def site_of(analysis: Any, instance: int) -> str | None:
    """An instance's call site: its last rank's (the ranks of one collective call it from one
    place, but for a divergence, which ``check`` says)."""
    code = int(analysis.straggler_site[instance])
    return analysis.site_names[code] if code >= 0 else None


def launches_of_partition(plan: Partitioning, k: int) -> dict[str, Any]:
    """Partition ``k``'s launches as its figures saw them (clocks applied, waits): read
    again, for the parts of its instances."""
    matched = parts.match_partition(plan, k)
    figured = parts.figure_partition(plan, matched, plan.shift, plan.heat, keep_launches=True)
    assert figured.launch is not None
    return figured.launch


def rank_launches(analysis: Any, columns: list[int]) -> dict[str, Any]:
    """Every launch of the ranks ``columns`` that is part of an instance, as the figures saw
    it (clocks applied, its wait), in instance order then rank: read from their rows."""
    plan = analysis.plan
    f = analysis.figures()
    got: dict[str, list[Any]] = {n: [] for n in ("instance", "column", "start", "end", "wait")}
    for column in columns:
        s = plan.sources[column]
        c = s.read(0, s.count, ("group", "seq", "start_us", "end_us"))
        key = (s.group_map[np.asarray(c["group"], np.intp)].astype(np.int64) << SEQ_BITS) \
            | np.asarray(c["seq"], np.int64)
        shift = s.shift_us - float(plan.shift[column])
        start = np.asarray(c["start_us"], np.float64) + shift
        end = np.asarray(c["end_us"], np.float64) + shift
        next_start = np.r_[start[1:], np.nan]
        instance = lookup(analysis.keys, key)
        found = instance >= 0
        instance = instance[found]
        got["instance"].append(instance)
        got["column"].append(np.full(len(instance), column, np.int32))
        got["start"].append(start[found])
        got["end"].append(end[found])
        got["wait"].append(parts.waits_of(start[found], end[found], next_start[found],
                                          f.last[instance], f.transfer[instance]))
    joined = {n: np.concatenate(v) if v else np.zeros(0) for n, v in got.items()}
    by = np.lexsort((joined["column"], joined["instance"])) if len(joined["instance"]) \
        else np.zeros(0, np.int64)
    return {n: v[by] for n, v in joined.items()}

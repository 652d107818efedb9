"""What the analysis found: the instances and their figures (``Figures``, whole arrays), the
clocks, the ranks' figures, what could not be matched and which ranks are missing — and the
questions the renderers ask of them (``Analysis``). Made by ``passes``; no analysis here."""


from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from autoannot.traces import names
from autoannot.traces.analysis.stragglers import NOISE_LEAST  # (the watch's rule: one measure)

#: A rank stands out of the job's own noise (``Analysis.standing_out``) where it was this many
#: times later than the others, and at least ``STAND_OUT_FLOOR_US`` late; steadily where it
#: was last at ``STEADY_SHARE`` of at least ``STEADY_LEAST`` instances of a group.
STAND_OUT_FACTOR = 3.0
STAND_OUT_FLOOR_US = 10.0
STEADY_SHARE = 0.75
STEADY_LEAST = 4
#: Below this, arrivals count as simultaneous: no straggler is named.
IN_STEP_US = 2.0
#: Problems listed one by one up to this many; the rest counted.
LISTED_PROBLEMS = 50


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
    """The instances and their figures (numbered partition by partition, each in (group,
    seq) order: one partition is (group, seq) order). The launches stay in their partitions:
    those of an instance are read when asked (``launches_of``), kept for the last partition
    read (all of them where there is one partition)."""

    instances: Sequence[Instance]
    clocks: list[ClockFit]
    problems: list[str] = field(default_factory=list)  # what could not be matched, and why
    ranks: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what to keep in mind (not a failure)
    #: Groups whose ranks did not all leave a record, or did not all reach its last instance.
    missing: list[dict[str, Any]] = field(default_factory=list)
    #: A hang's lead (``hang``: its culprits, blocked ranks, cycles) and what --json says of
    #: it; the ranks' mismatches (an instance they launched differently), a line each.
    hang_lead: list[str] = field(default_factory=list)
    hang: dict[str, Any] | None = None
    mismatches: list[str] = field(default_factory=list)
    seq: Any = None
    table: Figures | None = None
    site_names: Any = None
    ranks_figures: list[dict[str, Any]] | None = None
    #: Whether warm-up instances count in the ranking (``include_warmup``).
    warmup_counted: bool = False
    plan: Any = None  # ``partitions.Partitioning``: what reads a partition's launches again
    bases: Any = None  # each partition's first instance
    straggler_column: Any = None  # per instance, the last to arrive (in step or not)
    straggler_site: Any = None  # per instance, the last to arrive's call site (a code)
    cells: Any = None  # the heat map's cells (``partitions.figure_partition``)
    heat: Any = None
    #: Partition k's launches, read again (``driver.launches_of_partition``).
    read_partition: Any = None
    keys: Any = None  # (the instances' keys sorted, the order that sorts them)
    _kept: tuple[int, dict[str, Any]] | None = None

    def figures(self) -> Figures:
        assert self.table is not None
        return self.table

    def keep_partition(self, k: int, launch: dict[str, Any]) -> None:
        self._kept = (k, launch)

    def partition_of(self, index: int) -> int:
        import numpy as np

        return int(np.searchsorted(self.bases, index, "right") - 1)

    def launches_of(self, index: int) -> dict[str, Any]:
        """Instance ``index``'s launches (column, start, end, site, wait), by rank."""
        k = self.partition_of(index)
        if self._kept is None or self._kept[0] != k:
            assert self.read_partition is not None
            self._kept = (k, self.read_partition(k))
        launch = self._kept[1]
        local = index - int(self.bases[k])
        rows = launch["rows"][int(launch["offsets"][local]):int(launch["offsets"][local + 1])]
        return {name: launch[name][rows] for name in ("column", "start", "end", "site", "wait")}

    def site(self, index: int, column: int) -> str | None:
        """The call site of rank ``ranks[column]``'s part in instance ``index``."""
        import numpy as np

        if self.straggler_column is not None and int(self.straggler_column[index]) == column:
            code = int(self.straggler_site[index])
        else:
            launch = self.launches_of(index)
            at = int(np.searchsorted(launch["column"], column))
            if at >= len(launch["column"]) or launch["column"][at] != column:
                return None
            code = int(launch["site"][at])
        return self.site_names[code] if code >= 0 else None

    def _parts(self, instance: Instance) -> list[tuple[int, float, float, str | None]]:
        """(rank, start, wait, call site) of the ranks that took part."""
        launch = self.launches_of(instance.index)
        names, ranks = self.site_names, self.ranks
        return [(ranks[c], start, wait, names[code] if code >= 0 else None)
                for c, start, wait, code in zip(launch["column"].tolist(),
                                                launch["start"].tolist(),
                                                launch["wait"].tolist(),
                                                launch["site"].tolist(), strict=True)]

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
        if len(blamed) > top > 0:  # (those that can be among the top: the top's least, ties)
            least = np.partition(f.blame[blamed], len(blamed) - top)[len(blamed) - top]
            blamed = blamed[f.blame[blamed] >= least]
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

    def standing_out(self) -> dict[str, Any] | None:
        """The origin to lead with (``origins``' form) where a rank stands out of the job's
        own noise; None where none does. Once: the largest delay, where its rank arrived
        ``STAND_OUT_FACTOR`` times later than any other rank ever arrived last. Steadily: a
        rank last at ``STEADY_SHARE`` of a group's instances (at least ``STEADY_LEAST``), late
        there by a median ``STAND_OUT_FACTOR`` times the others' when they were last in that
        group (its largest delay is led with; the others' median counts where they were last at
        ``NOISE_LEAST`` instances at least). Both at least ``STAND_OUT_FLOOR_US`` late. Warm-up
        is left out unless counted."""
        import numpy as np

        top = self.origins(1)
        if not top:
            return None
        f = self.figures()
        counted = (f.straggler >= 0) & (~f.warmup | self.warmup_counted)
        late = np.asarray(f.skew - f.carried, dtype=float)
        column = self.ranks.index(top[0]["rank"])
        others = counted & (f.straggler != column)
        worst_other = float(late[others].max()) if others.any() else 0.0
        if top[0]["late_us"] >= max(STAND_OUT_FLOOR_US, STAND_OUT_FACTOR * worst_other):
            return top[0]
        columns = len(self.ranks)
        group = np.asarray(f.group, dtype=np.int64)
        straggler = np.asarray(f.straggler, dtype=np.int64)
        totals = np.bincount(group[counted], minlength=len(f.group_names))
        pairs = np.bincount(group[counted] * columns + straggler[counted],
                            minlength=len(f.group_names) * columns)
        for code in np.flatnonzero(pairs >= STEADY_SHARE * np.repeat(totals, columns)):
            g, column = divmod(int(code), columns)
            if totals[g] < STEADY_LEAST:
                continue
            mine = counted & (group == g) & (straggler == column)
            theirs = counted & (group == g) & (straggler != column)
            bar = (STAND_OUT_FACTOR * float(np.median(late[theirs]))
                   if theirs.sum() >= NOISE_LEAST else 0.0)  # (fewer: no measure of noise)
            if float(np.median(late[mine])) >= max(STAND_OUT_FLOOR_US, bar):
                rank = self.ranks[column]
                return next((o for o in self.origins(len(self.instances))
                             if o["rank"] == rank), None)
        return None

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


def describe_missing(entry: dict[str, Any]) -> str:
    """One line naming a group's missing ranks, furthest behind first: 'group 0 (default_pg):
    rank 3 left no record; ranks 0-2 reached broadcast #13', 'rank 3's last launch was
    allreduce #8 (it never entered #9)'."""
    reached = entry["reached"]
    name = f"group {names.group_label(entry['group'], entry['group_desc'], entry['members'])}"
    said = []
    if entry["no_record"]:
        said.append(f"{rank_list(entry['no_record'])} left no record")
    if entry["no_record_unknown"]:
        said.append(f"{entry['no_record_unknown']} of its {entry['size']} ranks left no record "
                    "(the inputs do not name the group's ranks)")
    for one in sorted(entry["behind"], key=lambda b: (b["seq"], b["rank"])):
        following = one.get("next")
        never = (f"#{one['seq'] + 1}" if not following else
                 f"#{one['seq'] + 1} {following['collective']}{_at(following.get('call_site'))}")
        said.append(f"rank {one['rank']}'s last launch was {one['collective']} #{one['seq']}"
                    f"{_at(one.get('call_site'))} (it never entered {never})")
    said.append(f"{rank_list(reached['ranks'])} reached {reached['collective']} "
                f"#{reached['seq']}{_at(reached.get('call_site'))}")
    return f"{name}: " + "; ".join(said)


def _at(call_site: str | None) -> str:
    return f" at {call_site}" if call_site else ""


def rank_list(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0-2', 'ranks 0, 2 and 5'."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    gaps = sorted(set(range(ranks[0], ranks[-1] + 1)) - set(ranks))
    if len(ranks) > 8 and len(gaps) <= 3:  # (all but a few: 'ranks 0-1023 but 777')
        return f"ranks {ranks[0]}-{ranks[-1]} but {', '.join(map(str, gaps))}"
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

"""A straggler: a rank that arrives last at its group's collectives, again and again, by more
than the job's own noise.

Over the last ``window`` instances every member entered, a rank is *late* at an instance
where it arrived last and the others waited for it (its entry less the one before it) longer
than the threshold: ``floor_us``, and ``factor`` times the job's own noise, the median of
the same wait at the window's instances where some *other* rank was last, and of how far
apart the other ranks arrived. Where each rank's time outside collectives before it is known
(``gaps``: its entry less the return of its launch before), the wait counts only as far as
the last rank spent longer outside than the others did: a rank that arrived last because it
was held in its collective before (by another rank) is not late by its own. A rank late at
``needed`` of them or more stands out; a job whose ranks take turns being last (CPU noise)
has none.

Entry times are compared only where they share a clock (``clocks``: each rank's, its host's
monotonic clock). A group whose members' clocks differ, or are not all known, is read from
the time each rank spent outside collectives before each instance alone (``gaps``: one
rank's own clock each, never compared with another's): where the launch before returned at
about the same time on every rank (a collective's completion), what the others waited for
the last is how much longer it spent outside. A clock offset between hosts is never read as
lateness. Pure: no I/O.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

#: Defaults: the last 20 complete instances of a group, late at 15 of them, by 2 ms and 3 x
#: the noise at least.
WINDOW, NEEDED, FLOOR_US, FACTOR = 20, 15, 2000.0, 3.0


@dataclass(frozen=True)
class Straggler:
    """``rank`` was late at ``late`` of the last ``window`` instances of ``group`` (from #``first``
    to #``last``), the others waiting ``late_by_us`` for it (median), where their own noise
    is ``noise_us``."""

    rank: int
    group: str
    late: int
    window: int
    late_by_us: float
    noise_us: float
    first: int
    last: int
    #: Read from the time outside collectives alone (its group spans clocks: hosts).
    by_time_outside: bool = False

    def line(self, group_name: str | None = None, call_site: str | None = None) -> str:
        """What is said of it (``group_name``: the group as the reader knows it)."""
        where = f"of group {group_name or self.group}'s last {self.window} collectives"
        if self.by_time_outside:
            said = (f"STRAGGLER: rank {self.rank} spent the longest outside collectives "
                    f"before {self.late} {where} (#{self.first}-#{self.last}), "
                    f"{_us(self.late_by_us)} longer than the others (median; their own noise "
                    f"{_us(self.noise_us)}; the group spans hosts, whose clocks are not "
                    "compared)")
        else:
            said = (f"STRAGGLER: rank {self.rank} arrived last at {self.late} {where} "
                    f"(#{self.first}-#{self.last}), the others waiting "
                    f"{_us(self.late_by_us)} for it (median; their own noise "
                    f"{_us(self.noise_us)})")
        return said + (f"; its call site {call_site}" if call_site else "")


def _us(value: float) -> str:
    return f"{value / 1e3:.3g} ms" if value >= 1000 else f"{value:.3g} us"


def stragglers(entered: dict[str, dict[int, dict[int, float]]],
               members: dict[str, tuple[int, ...]], window: int = WINDOW,
               needed: int = NEEDED, floor_us: float = FLOOR_US,
               factor: float = FACTOR,
               gaps: dict[str, dict[int, dict[int, float]]] | None = None,
               clocks: dict[int, str | None] | None = None) -> list[Straggler]:
    """The ranks that stand out, per group: ``entered[group][rank][seq]`` is when ``rank``
    entered ``group``'s #seq (us, its clock); ``members[group]``, its ranks (a group whose
    members are not all in ``entered`` is left out: a missing rank is not an on-time one);
    ``gaps``, keyed alike: each launch's time outside collectives before it (NaN: unknown);
    ``clocks``: each rank's clock (its host; None: unknown), where the ranks may not share
    one (None: they all do)."""
    found = []
    for group, per_rank in sorted(entered.items()):
        ranks = members.get(group)
        if not ranks or len(ranks) < 2 or any(r not in per_rank for r in ranks):
            continue
        one_clock = clocks is None or (
            len({clocks.get(r) for r in ranks}) == 1 and clocks.get(ranks[0]) is not None)
        if not one_clock:  # (what each spent outside, on its own clock: a time since the
            per_rank = {r: {s: v for s, v in ((gaps or {}).get(group) or {}).get(r, {}).items()
                            if np.isfinite(v)} for r in ranks}  # launch before returned)
        common = set.intersection(*(set(per_rank[r]) for r in ranks))
        seqs = sorted(common)[-window:]
        if len(seqs) < needed:
            continue
        times = np.array([[per_rank[r][s] for r in ranks] for s in seqs])  # instance x rank
        order = np.argsort(times, axis=1, kind="stable")
        arrived = np.take_along_axis(times, order, axis=1)
        last = order[:, -1]
        waited = arrived[:, -1] - arrived[:, -2]  # what the others waited for the last
        spread = arrived[:, -2] - arrived[:, 0]  # how far apart the others arrived
        outside = (np.array([[gaps[group][r].get(s, np.nan) for r in ranks] for s in seqs])
                   if one_clock and gaps and group in gaps
                   and all(r in gaps[group] for r in ranks) else None)
        if outside is not None:  # (its own part of the wait: what it spent outside longer)
            own = np.take_along_axis(outside, last[:, None], axis=1)[:, 0]
            masked = outside.copy()
            np.put_along_axis(masked, last[:, None], np.nan, axis=1)
            with warnings.catch_warnings():  # (an instance with no other's gap known)
                warnings.simplefilter("ignore", RuntimeWarning)
                others = np.nanmedian(masked, axis=1)
            extra = own - others
            waited = np.where(np.isfinite(extra), np.clip(np.minimum(waited, extra), 0, None),
                              waited)
        for column, rank in enumerate(ranks):
            mine = last == column
            if mine.sum() < needed:
                continue
            noise = float(np.median(np.concatenate([waited[~mine], spread]))) if (
                (~mine).any() or len(spread)) else 0.0
            late = mine & (waited >= max(floor_us, factor * noise))
            if late.sum() >= needed:
                found.append(Straggler(rank, group, int(late.sum()), len(seqs),
                                       float(np.median(waited[late])), noise, seqs[0],
                                       seqs[-1], not one_clock))
    return found

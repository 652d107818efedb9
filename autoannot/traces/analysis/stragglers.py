"""A straggler: a rank that arrives last at its group's collectives, again and again, by more
than the job's own noise, for as long as a person would call persistent.

**A window** is ``WINDOW`` consecutive instances of a group that every member entered. A rank
is *late* at an instance where it arrived last and the others waited for it (its entry less
the one before it) at least the threshold: ``FLOOR_US``, and ``FACTOR`` times the job's own
noise. Where each rank's time outside collectives before it is known (``gaps``: its entry less
the return of its launch before), the wait counts only as far as the last rank spent longer
outside than the others did: a rank that arrived last because it was held in its collective
before (by another rank) is not late by its own. A window *shows* a rank late at ``NEEDED`` of
its instances or more.

**The job's own noise** (for a rank) is the median of the same wait at the instances of the
last ``HISTORY`` windows of every group where some *other* rank was last, and of how far
apart the other ranks arrived (groups of three ranks or more): measured over many windows and
groups, never over one window alone, never from fewer than ``NOISE_LEAST`` waits (one outlier
is no measure), and never below ``NOISE_FLOOR_US`` (a host's clock and wake-up cannot tell
waits apart below it). Where no other rank was last often enough there is no measure: the
threshold is the floor alone, and the line says so.

**Persistent**: a rank is named (``Tracker``) once ``WINDOWS`` consecutive windows of a group
show it and they span ``SPAN_S`` seconds of the job's time at least (a fast group needs more
windows: its 60 collectives in half a second are a blip), said once; and said to no longer
stand out once as many consecutive windows, over as long, do not show it. A window that does
not show it in between changes nothing. Each window is read once, in order; a window the
reader fell behind on (its instances no longer in what it reads) is skipped.

Entry times are compared only where they share a clock (``clocks``: each rank's, its host's
monotonic clock). A group whose members' clocks differ, or are not all known, is read from
the time each rank spent outside collectives before each instance alone (``gaps``: one rank's
own clock each, never compared with another's): where the launch before returned at about the
same time on every rank (a collective's completion), what the others waited for the last is
how much longer it spent outside. A clock offset between hosts is never read as lateness.
Pure: no I/O.
"""

from __future__ import annotations

import warnings
from collections import deque
from dataclasses import dataclass, field

import numpy as np

#: A window's instances; late at this many of them, it shows a rank.
WINDOW, NEEDED = 20, 15
#: Named (and said to no longer stand out) after this many consecutive windows, over this many
#: seconds of the job's time at least.
WINDOWS, SPAN_S = 3, 2.0
#: Late by this much at least, and this many times the job's own noise.
FLOOR_US, FACTOR = 2000.0, 3.0
#: Each group's last windows the job's noise is measured over; its least value; the fewest
#: waits it is measured from (fewer: unmeasured — one rank last once by an outlier is no
#: measure of the job's noise).
HISTORY, NOISE_FLOOR_US, NOISE_LEAST = 10, 10.0, 5

#: entered[group][rank][seq]: when (us, its clock) — the readers' shape of the last launches.
Entered = dict[str, dict[int, dict[int, float]]]


@dataclass(frozen=True)
class Straggler:
    """``rank`` was late at ``late`` of ``instances`` instances of ``group`` (#``first`` to
    #``last``, ``windows`` windows over ``span_s`` seconds), the others waiting ``late_by_us``
    for it (median); the job's own noise ``noise_us`` (None: too few others last to measure
    it) over ``noise_of`` instances."""

    rank: int
    group: str
    late: int
    instances: int
    late_by_us: float
    noise_us: float | None
    first: int
    last: int
    windows: int = 1
    span_s: float = 0.0
    noise_of: int = 0
    #: Read from the time outside collectives alone (its group spans clocks: hosts).
    by_time_outside: bool = False
    #: What the group is called (``names.group_label``), and the rank's call site there.
    label: str = ""
    called: str = ""
    call_site: str | None = None
    #: Read from the GPU's times (when each rank's GPU started each collective), not the
    #: hosts' entries.
    on_gpu: bool = False

    def line(self) -> str:
        """What is said when it is named."""
        where = (f"of group {self.label or self.group}'s {self.instances} collectives "
                 f"#{self.first}-#{self.last} ({self.windows} windows, {self.span_s:.1f} s)")
        noise = (f"the job's own noise {_us(self.noise_us)}, the median over {self.noise_of} "
                 "collectives where another rank was last" if self.noise_us is not None else
                 f"another rank was last at fewer than {NOISE_LEAST} collectives: the job's "
                 "noise unmeasured")
        if self.by_time_outside:
            said = (f"STRAGGLER: rank {self.rank} spent the longest outside collectives "
                    f"before {self.late} {where}, {_us(self.late_by_us)} longer than the "
                    f"others (median; {noise}; the group spans hosts, whose clocks are not "
                    "compared)")
        elif self.on_gpu:
            said = (f"STRAGGLER: rank {self.rank}'s GPU started last at {self.late} {where}, "
                    f"the others' GPUs waiting {_us(self.late_by_us)} for it (median; "
                    f"{noise}; from the GPU's times)")
        else:
            said = (f"STRAGGLER: rank {self.rank} arrived last at {self.late} {where}, the "
                    f"others waiting {_us(self.late_by_us)} for it (median; {noise})")
        return said + (f"; its call site {self.call_site}" if self.call_site else "")

    def ended_line(self, late: int, instances: int, first: int, last: int, span_s: float
                   ) -> str:
        """What is said when it no longer stands out."""
        return (f"rank {self.rank} no longer stands out in group {self.label or self.group}: "
                f"late at {late} of its {instances} collectives #{first}-#{last} "
                f"({span_s:.1f} s)")


def _us(value: float) -> str:
    return f"{value / 1e3:.3g} ms" if value >= 1000 else f"{value:.3g} us"


@dataclass(frozen=True)
class Window:
    """``size`` consecutive instances of ``group`` every member entered (#``first`` to
    #``last``), ``span_us`` of the job's time: per instance, the column of the rank that
    arrived last (``last_rank``, into ``ranks``), how long the others waited for it, its own
    part (``waited``, us), and how far apart the others arrived (``spread``; groups of three
    ranks or more)."""

    group: str
    ranks: tuple[int, ...]
    first: int
    last: int
    span_us: float
    last_rank: np.ndarray = field(repr=False)
    waited: np.ndarray = field(repr=False)
    spread: np.ndarray = field(repr=False)
    by_time_outside: bool = False

    @property
    def last_of(self) -> np.ndarray:
        """The rank that arrived last at each instance (its global rank)."""
        return np.asarray(self.ranks)[self.last_rank]


def windows(entered: Entered, members: dict[str, tuple[int, ...]], after: dict[str, int],
            size: int = WINDOW, gaps: Entered | None = None,
            clocks: dict[int, str | None] | None = None) -> list[Window]:
    """The windows of each group not read yet: runs of ``size`` instances every member
    entered, each after the last seq ``after`` holds for its group (then moved on), oldest
    first. ``entered[group][rank][seq]``: when ``rank`` entered ``group``'s #seq (us, its
    clock); ``members[group]``: its ranks (a group whose members are not all in ``entered`` is
    left out: a missing rank is not an on-time one); ``gaps``, keyed alike: each launch's time
    outside collectives before it (NaN: unknown); ``clocks``: each rank's clock (its host;
    None: unknown), where the ranks may not share one (None: they all do)."""
    found = []
    for group, per_rank in sorted(entered.items()):
        ranks = members.get(group)
        if not ranks or len(ranks) < 2 or any(r not in per_rank for r in ranks):
            continue
        one_clock = clocks is None or (
            len({clocks.get(r) for r in ranks}) == 1 and clocks.get(ranks[0]) is not None)
        times_of = per_rank
        if not one_clock:  # (what each spent outside, on its own clock: a time since the
            times_of = {r: {s: v for s, v in ((gaps or {}).get(group) or {}).get(r, {}).items()
                            if np.isfinite(v)} for r in ranks}  # launch before returned)
        common = sorted(set.intersection(*(set(times_of[r]) for r in ranks)))
        done = after.get(group, -1)
        common = [s for s in common if s > done]
        outside_of = ((gaps or {}).get(group) or {}) if one_clock else {}
        for at in range(0, len(common) - size + 1, size):
            seqs = common[at:at + size]
            found.append(_window(group, ranks, seqs, times_of, per_rank[ranks[0]],
                                 outside_of if all(r in outside_of for r in ranks) else None,
                                 not one_clock))
            after[group] = seqs[-1]
    return found


def _window(group: str, ranks: tuple[int, ...], seqs: list[int],
            times_of: dict[int, dict[int, float]], own_clock: dict[int, float],
            outside_of: dict[int, dict[int, float]] | None, by_time_outside: bool) -> Window:
    times = np.array([[times_of[r][s] for r in ranks] for s in seqs])  # instance x rank
    order = np.argsort(times, axis=1, kind="stable")
    arrived = np.take_along_axis(times, order, axis=1)
    last = order[:, -1]
    waited = arrived[:, -1] - arrived[:, -2]  # what the others waited for the last
    spread = (arrived[:, -2] - arrived[:, 0]) if len(ranks) > 2 else np.empty(0)
    if outside_of is not None:  # (its own part of the wait: what it spent outside longer)
        outside = np.array([[outside_of[r].get(s, np.nan) for r in ranks] for s in seqs])
        own = np.take_along_axis(outside, last[:, None], axis=1)[:, 0]
        masked = outside.copy()
        np.put_along_axis(masked, last[:, None], np.nan, axis=1)
        with warnings.catch_warnings():  # (an instance with no other's gap known)
            warnings.simplefilter("ignore", RuntimeWarning)
            others = np.nanmedian(masked, axis=1)
        extra = own - others
        waited = np.where(np.isfinite(extra), np.clip(np.minimum(waited, extra), 0, None),
                          waited)
    span = float(own_clock.get(seqs[-1], 0.0) - own_clock.get(seqs[0], 0.0))
    return Window(group, ranks, seqs[0], seqs[-1], max(span, 0.0), last, waited, spread,
                  by_time_outside)


@dataclass
class _Streak:
    """A rank's consecutive windows of one group with one verdict (shown, or not)."""

    shown: bool
    windows: int = 0
    instances: int = 0
    late: int = 0
    first: int = 0
    last: int = 0
    span_us: float = 0.0
    late_waits: list[float] = field(default_factory=list)
    noise: tuple[float | None, int] = (None, 0)

    def add(self, window: Window, late: np.ndarray, noise: tuple[float | None, int]) -> None:
        if not self.windows:
            self.first = window.first
        self.windows += 1
        self.instances += len(window.last_rank)
        self.late += int(late.sum())
        self.last = window.last
        self.span_us += window.span_us
        self.late_waits += window.waited[late].tolist()
        self.noise = noise


class Tracker:
    """The stragglers of a job as its windows come (``update``): a rank named once it stands
    out persistently, said to no longer stand out once it persistently does not (see the
    module's docstring). ``named``: (rank, group) -> its ``Straggler``, while named."""

    def __init__(self, size: int = WINDOW, needed: int = NEEDED, windows: int = WINDOWS,
                 span_s: float = SPAN_S, floor_us: float = FLOOR_US, factor: float = FACTOR,
                 history: int = HISTORY) -> None:
        self.size, self.needed, self.windows, self.span_us = size, needed, windows, span_s * 1e6
        self.floor_us, self.factor = floor_us, factor
        self.named: dict[tuple[int, str], Straggler] = {}
        self._after: dict[str, int] = {}  # group -> the last seq of its windows read
        self._recent: dict[str, deque[Window]] = {}  # group -> its last windows (the noise)
        self._streaks: dict[tuple[int, str], _Streak] = {}
        self._history = history

    def update(self, entered: Entered, members: dict[str, tuple[int, ...]],
               gaps: Entered | None = None, clocks: dict[int, str | None] | None = None,
               sites: dict[tuple[str, int], str] | None = None,
               labels: dict[str, tuple[str, str]] | None = None, gpu: set[str] | None = None
               ) -> tuple[list[Straggler], list[str]]:
        """Read the windows not read yet (``windows``' inputs; ``sites``: (group, rank) -> its
        call site there; ``labels``: group -> (its label, what it is called); ``gpu``: the
        groups read from the GPU's times): the stragglers named now, and the lines of those
        that no longer stand out."""
        named, ended = [], []
        for window in windows(entered, members, self._after, self.size, gaps, clocks):
            recent = self._recent.setdefault(window.group, deque(maxlen=self._history))
            recent.append(window)
            for column, rank in enumerate(window.ranks):
                said = self._judge(window, column, rank, (labels or {}).get(window.group),
                                   (sites or {}).get((window.group, rank)),
                                   window.group in (gpu or ()))
                if isinstance(said, Straggler):
                    named.append(said)
                elif said is not None:
                    ended.append(said)
        return named, ended

    def noise(self, rank: int) -> tuple[float | None, int]:
        """The job's own noise for ``rank`` (us; None: unmeasured) and over how many
        collectives."""
        waits = [w.waited[w.last_of != rank] for recent in self._recent.values() for w in recent]
        spreads = [w.spread for recent in self._recent.values() for w in recent]
        pooled = np.concatenate(waits + spreads) if waits or spreads else np.empty(0)
        if len(pooled) < NOISE_LEAST:
            return None, 0
        return max(float(np.median(pooled)), NOISE_FLOOR_US), sum(len(w) for w in waits)

    def _judge(self, window: Window, column: int, rank: int, label: tuple[str, str] | None,
               site: str | None, on_gpu: bool = False) -> Straggler | str | None:
        """A window's verdict on one rank: the ``Straggler`` where it is named now, the line
        where it no longer stands out, else None."""
        noise = self.noise(rank)
        threshold = max(self.floor_us, self.factor * (noise[0] or 0.0))
        late = (window.last_rank == column) & (window.waited >= threshold)
        shown = int(late.sum()) >= self.needed
        key = (rank, window.group)
        streak = self._streaks.get(key)
        if streak is None or streak.shown != shown:
            streak = self._streaks[key] = _Streak(shown)
        streak.add(window, late, noise)
        persistent = streak.windows >= self.windows and streak.span_us >= self.span_us
        found = self.named.get(key)
        if shown and (found is None or persistent):
            if found is None and not persistent:
                return None
            straggler = Straggler(
                rank, window.group, streak.late, streak.instances,
                float(np.median(streak.late_waits)), streak.noise[0], streak.first,
                streak.last, streak.windows, streak.span_us / 1e6, streak.noise[1],
                window.by_time_outside, *(label or ("", "")), site, on_gpu)
            self.named[key] = straggler
            return straggler if found is None else None
        if not shown and found is not None and persistent:
            del self.named[key]
            return found.ended_line(streak.late, streak.instances, streak.first, streak.last,
                                    streak.span_us / 1e6)
        return None


def persistent(entered: Entered, members: dict[str, tuple[int, ...]],
               gaps: Entered | None = None, clocks: dict[int, str | None] | None = None,
               **rule: float) -> list[Straggler]:
    """The ranks named stragglers at the end of what is read (every window in order, as a
    watcher that looked throughout would have read them); ``rule``: ``Tracker``'s."""
    tracker = Tracker(**rule)  # type: ignore[arg-type]
    tracker.update(entered, members, gaps, clocks)
    return sorted(tracker.named.values(), key=lambda s: (s.group, s.rank))


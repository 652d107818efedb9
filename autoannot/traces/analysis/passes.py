"""The analysis's passes over its partitions (``partitions``), run by an engine (``engines``),
and what the driver joins of them: the plan from the ranks' rows, the instances' facts, the
clocks, and — over every instance at once — the cause chains, the blame and each rank's
figures. Small results cross between the driver and the tasks (per-instance arrays, per-rank
sums, cells); launches never do."""

from __future__ import annotations

from typing import Any

from autoannot.traces import files, names
from autoannot.traces.analysis import partitions as parts
from autoannot.traces.analysis.partitions import SEQ_BITS, Partitioning, Source


def plan_of(ranks_rows: list[Any]) -> Partitioning:
    """The plan of every rank's rows (``rows.Rows``: in memory, or heads of rows files whose
    columns are read by row range)."""
    import numpy as np

    from autoannot.traces.table import rows as table

    ranks_rows = sorted(ranks_rows, key=lambda r: r.rank)
    for position, one in enumerate(ranks_rows):  # (Parquet rows: read whole, in memory)
        if not one.columns and one.layout is None:
            if one.path is None:
                raise files.TraceError(f"rank {one.rank}'s rows have no columns")
            full = table.read(one.path, numpy=True)
            if len(full) != len(one):
                raise files.TraceError(f"{one.path}: changed while it was read")
            ranks_rows[position] = full
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
    sources: list[Source] = []
    surveys: list[Any] = []
    made: dict[Any, Any] = {}  # (``_codes``: each list of names' codes, made once)
    for one in ranks_rows:
        for g in one.groups:
            gid = group_id[str(g["name"])]
            group_size[gid] = max(int(group_size[gid]), int(g.get("size", 1)))
            desc = str(g.get("desc", ""))
            if desc not in names.NO_DESCRIPTION:
                group_desc[gid] = group_desc[gid] or desc
            if isinstance(g.get("ranks"), list) and group_members[gid] is None:
                group_members[gid] = tuple(int(r) for r in g["ranks"])
        # send and recv are one instance's two sides: compared as one
        collective_map = _codes(
            made, "collective", one.collectives, lambda n: collectives.setdefault(
                "send/recv" if n in ("send", "recv") else n, len(collectives)), np.int32)
        site_map = _codes(made, "site", one.sites, lambda n: sites.setdefault(n, len(sites)),
                          np.int32, end=[-1])
        dtype_map = _codes(made, "dtype", one.dtypes,
                           lambda n: dtypes.setdefault(n, len(dtypes)), np.int16)
        group_map = _codes(made, "group", [str(g["name"]) for g in one.groups],
                           group_id.__getitem__, np.int32)
        shift = 0.0
        if origin is not None:  # onto one epoch (rows of traces with other time bases)
            shift = ((one.base_ns if one.clock == "trace" else 0) - origin) / 1e3
        source = Source(one.rank, len(one), group_map, collective_map, site_map, dtype_map,
                        shift, origin=str(one.path or one.source or ""))
        source.same_codes = tuple(name for name, codes in (
            ("group", group_map), ("collective", collective_map), ("site", site_map),
            ("dtype", dtype_map)) if made[id(codes)])
        if one.columns:
            source.columns = _in_time_order({n: np.asarray(one.columns[n])
                                             for n in parts.READ})
        else:
            assert one.path is not None and one.layout is not None
            source.path = str(one.path)
            source.kinds = parts.kinds_of(one.layout)
            source.data_offset = int(one.data_offset or 0)
        sources.append(source)
        surveys.append(_survey_of_head(one, group_map))
    # a group made without a description is called by its ranks, in every answer
    group_desc = [names.group_desc(d, m) for d, m in zip(group_desc, group_members, strict=True)]
    plan = Partitioning(sources, [r.rank for r in ranks_rows], group_keys, group_size, group_desc,
                group_members,
                [n for n, _ in sorted(collectives.items(), key=lambda item: item[1])],
                [s for s, _ in sorted(sites.items(), key=lambda item: item[1])],
                [d for d, _ in sorted(dtypes.items(), key=lambda item: item[1])])
    plan.surveys = surveys
    for column, source in enumerate(sources):
        if surveys[column] is None and source.columns is not None:
            surveys[column] = parts.survey_source(plan, column)
    return plan


def _codes(made: dict[Any, Any], kind: str, names: list[str], code: Any, dtype: Any,
           end: list[int] | None = None) -> Any:
    """The plan's codes of a rank's list of names (``code`` of each: codes are given in the
    order names are first seen, so one list has one map), made once for every rank with
    that list; ``made[id(map)]`` says whether the map is the identity (the rank's codes are
    the plan's already). ``end``: kept at the end (site -1 stays -1)."""
    import numpy as np

    key = (kind, tuple(names))
    found = made.get(key)
    if found is None:
        found = made[key] = np.array([code(n) for n in names] + (end or []) or [0],
                                     dtype=dtype)
        plain = found[:len(found) - len(end or [])]
        made[id(found)] = bool(np.array_equal(plain, np.arange(len(plain))))
    return found


def _survey_of_head(one: Any, group_map: Any) -> Any:
    """(group, launches, lowest seq, highest seq) of a rows head that says them; else None."""
    import numpy as np

    if not one.groups or any("launches" not in g for g in one.groups):
        return None
    said = [(code, g["launches"], *g.get("seq", (0, 0)))
            for code, g in zip(group_map.tolist(), one.groups, strict=False) if g["launches"]]
    if not said:
        z = np.zeros(0, np.int64)
        return z, z, z, z
    return tuple(np.array(column, np.int64) for column in zip(*said, strict=True))


def _in_time_order(columns: dict[str, Any]) -> dict[str, Any]:
    if parts.is_time_ordered(columns["start_us"]):
        return columns
    order = parts.time_order(columns["start_us"])
    return {n: c[order] for n, c in columns.items()}


def _figure_task(plan: Partitioning, k: int) -> tuple[parts.Matched, parts.Figured]:
    """Pass 2 on one partition: matched, then its figures (its launches stay here)."""
    matched = parts.match_partition(plan, k)
    figured = parts.figure_partition(plan, matched, plan.shift, plan.heat)
    matched.launch = {}
    return matched, figured


#: Ranks a per-rank task takes (one task a rank costs a scheduler more than the work).
SOURCES_A_TASK = 256


def _sources_task(plan: Partitioning, item: tuple[Any, list[int]]) -> list[Any]:
    function, sources = item
    return [function(plan, source) for source in sources]


def _per_source(engine: Any, function: Any, plan: Partitioning, sources: list[int],
                label: str) -> list[Any]:
    """``function(plan, source)`` for each source, in tasks of ``SOURCES_A_TASK`` sources."""
    chunks = [sources[i:i + SOURCES_A_TASK] for i in range(0, len(sources), SOURCES_A_TASK)]
    return [one for done in engine.map(_sources_task, plan,
                                       [(function, chunk) for chunk in chunks], label)
            for one in done]


def partition(plan: Partitioning, engine: Any, target: int = parts.TARGET_LAUNCHES) -> list[Any]:
    """Pass 1: the partitions (cut by the groups' extents: the heads', or read), each
    source's row ranges and clock estimates (``partitions.Indexed``). A source out of time
    order is put in order in memory (rows files the job writes are in order)."""
    import numpy as np

    surveys = list(plan.surveys)
    lacking = [c for c, one in enumerate(surveys) if one is None]
    if lacking:
        for c, one in zip(lacking, _per_source(engine, parts.survey_source, plan, lacking,
                                               "surveying"), strict=True):
            surveys[c] = one
    plan.partitions, plan.starts = 1, np.zeros(1, np.int64)
    if sum(s.count for s in plan.sources) > target:
        parts.cut(plan, surveys, target)
    plan.surveys = surveys
    plan.reference = parts.reference_of(plan) if plan.sources else {"key": np.zeros(0)}
    plan.spoilt = None  # (each rank's clock fitted on the instances it does not spoil)
    everyone = list(range(len(plan.sources)))
    indexed = _per_source(engine, parts.index_source, plan, everyone, "indexing")
    spoilt = np.zeros(len(plan.reference["key"]), bool)
    for one in indexed:
        spoilt[one.spoilt] = True
    plan.spoilt = spoilt
    spoilt_at = np.flatnonzero(spoilt)
    again = [c for c, one in enumerate(indexed) if parts.needs_refit(one, spoilt_at)]
    if again:  # (fitted on an instance another rank spoils: fitted again, all known)
        for c, one in zip(again, _per_source(engine, parts.index_source, plan, again,
                                             "fitting clocks again"), strict=True):
            indexed[c] = one
    plan.ranges = np.stack([one.ranges for one in indexed]) if indexed \
        else np.zeros((0, 1, 2), np.int64)
    for column, one in enumerate(indexed):
        if not one.ordered:  # (rows written out of time order: this rank's, in memory)
            s = plan.sources[column]
            s.columns = _in_time_order(s.read(0, s.count))
            s.path = s.kinds = None
            indexed[column] = parts.index_source(plan, column)
            plan.ranges[column] = indexed[column].ranges
    return indexed


def index_in_memory(plan: Partitioning) -> tuple[list[parts.Indexed], dict[str, Any] | None]:
    """Pass 1 for a plan of one partition, in this process: every launch read once (the
    partition's read), and from it what ``partition`` finds rank by rank — the first rank's
    instances spoilt for the clock fit, then each rank's clock, found as ``index_source``
    finds it. (None for the launches where a rank's rows are out of time order: ``partition``
    puts them in order.)"""
    import numpy as np

    from autoannot.traces.analysis.results import ClockFit

    width = plan.width
    plan.partitions, plan.starts = 1, np.zeros(1, np.int64)
    counts = np.array([s.count for s in plan.sources], np.int64)
    plan.ranges = np.stack([np.zeros(width, np.int64), counts], axis=1).reshape(width, 1, 2)
    got = parts.read_partition(plan, 0)
    bounds = np.concatenate([[0], np.cumsum(counts)])  # (each rank's rows, in column order)
    start = got["start_us"]
    inner = np.ones(len(start), bool)
    heads = bounds[1:-1]
    inner[heads[heads < len(start)]] = False
    if len(start) > 1 and not np.all((start[1:] >= start[:-1]) | ~inner[1:]):
        return [], None
    max_step = int(np.max(got["step"], initial=-1))
    if max_step < 0 and any(one is None for one in plan.surveys):  # (what ``run`` reads of
        plan.surveys = parts.surveys_of(got, width, len(plan.group_keys))  # them: no steps)
    first = slice(int(bounds[0]), int(bounds[1]))
    key = (got["group"][first].astype(np.int64) << SEQ_BITS) | got["seq"][first]
    order = np.argsort(key, kind="stable")
    ref = {"key": key[order], "collective": got["collective"][first][order],
           "size": got["size_bytes"][first][order], "end": got["end_us"][first][order]}
    plan.reference = ref
    plan.spoilt = np.zeros(len(ref["key"]), bool)
    fits = [ClockFit(s.rank, 0.0, 0.0, 0, False) for s in plan.sources]
    if not len(ref["key"]):
        return [parts.Indexed(plan.ranges[c], True, max_step, fits[c]) for c in range(width)], \
            got
    # in stretches of whole ranks (a few hundred thousand rows: small passing arrays)
    stretches = _stretches(counts, 1 << 18)
    for lo, hi in stretches:  # the instances each rank spoils, all known before any fit
        at, shared = _in_reference(ref, got, slice(int(bounds[lo]), int(bounds[hi])))
        spoilt = parts.spoils(ref, at, got["collective"][shared], got["size_bytes"][shared],
                              got["kernel"][shared] == 1)
        plan.spoilt[at[spoilt]] = True
    for lo, hi in stretches:  # each rank's clock (as ``index_source`` fits it)
        at, shared = _in_reference(ref, got, slice(int(bounds[lo]), int(bounds[hi])))
        values = got["end_us"][shared] - ref["end"][at]
        fitted = ~np.isnan(values) & ~plan.spoilt[at]
        values, rows = values[fitted], shared[fitted]
        cuts = np.searchsorted(rows, bounds[lo:hi + 1])
        for column in range(max(lo, 1), hi):
            mine = values[cuts[column - lo]:cuts[column - lo + 1]]
            if not len(mine):
                continue
            offset = parts.median(mine)
            spread = parts.median(np.abs(mine - offset))
            fits[column] = ClockFit(plan.sources[column].rank, offset, spread, len(mine),
                                    abs(offset) > max(1.0, 3 * spread))
    indexed = [parts.Indexed(plan.ranges[column], True, max_step, fits[column])
               for column in range(width)]
    return indexed, got


def _stretches(counts: Any, rows: int) -> list[tuple[int, int]]:
    """Consecutive ranges of columns (lo, hi) of about ``rows`` rows each (a column whole)."""
    import numpy as np

    ends = np.cumsum(counts)
    found, lo = [], 0
    while lo < len(counts):
        before = int(ends[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, before + rows, "right")))
        found.append((lo, min(hi, len(counts))))
        lo = hi
    return found


def _in_reference(ref: dict[str, Any], got: dict[str, Any], rows: slice) -> tuple[Any, Any]:
    """``partitions.in_reference`` of the rows ``rows`` of ``got`` (their indices in ``got``)."""
    at, shared = parts.in_reference(ref, got["group"][rows], got["seq"][rows])
    return at, shared + rows.start


def run(plan: Partitioning, engine: Any, include_warmup: bool = False,
        target: int | None = None) -> Any:
    """Every pass of the analysis of ``plan``'s rows on ``engine``: an ``Analysis``. In
    partitions of about ``target`` launches; where none is given, a job of up to
    ``IN_MEMORY_LAUNCHES`` launches that this process runs is one partition, read once."""
    import numpy as np

    from autoannot.traces.analysis import driver

    launches = None
    whole = parts.IN_MEMORY_LAUNCHES if target is None else target
    if plan.launches() <= whole and engine.in_process(plan):
        indexed, launches = index_in_memory(plan)
    if launches is None:
        indexed = partition(plan, engine, target or parts.TARGET_LAUNCHES)
    fits = [one.clock for one in indexed]
    plan.shift = np.array([f.offset_us if f.applied else 0.0 for f in fits])
    max_step = max(one.max_step for one in indexed) if indexed else -1
    plan.heat = _heat_keys(plan, max_step)
    window_starts = _window_starts(plan) if max_step < 0 else None
    del indexed
    plan.surveys, plan.spoilt = [], None  # (the driver's: not shipped to every task)
    if plan.partitions == 1 and engine.in_process(plan):  # (here: its launches kept)
        matched = parts.match_partition(plan, 0, launches)
        del launches
        figured = parts.figure_partition(plan, matched, plan.shift, plan.heat,
                                         keep_launches=True)
        done = [(matched, figured)]
    else:
        done = engine.map(_figure_task, plan, range(plan.partitions), "matching")
    analysis = driver.build(plan, driver.join_matched([m for m, _ in done]),
                            [f for _, f in done], fits, include_warmup, window_starts)
    if window_starts is not None and _timed_launches(done):
        analysis.notes.append(NO_STEPS)
    return analysis


#: Said where traces were given and none has a profiler step.
NO_STEPS = ("no profiler steps in these traces (torch writes its ProfilerStep ranges only "
            "for a profiler with a schedule): warm-up is taken as each group's first "
            "collective and each rank's first collective of each group after its profiler "
            "started; profile with schedule=torch.profiler.schedule(...) and prof.step() to "
            "have steps")


def _window_starts(plan: Partitioning) -> Any:
    """The instance keys where some rank's launches of a group begin (the first collective
    of each group after its profiler started, for rows of a profiled window): sorted."""
    import numpy as np

    keys = [(group << SEQ_BITS) | low for group, _, low, _ in plan.surveys if len(group)]
    return np.unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)


def _timed_launches(done: list[Any]) -> bool:
    """Whether any launch was timed by a trace (not by its entry alone, as record files)."""
    return sum(f.bare for _, f in done) < sum(int(m.offsets[-1]) for m, _ in done)


def _heat_keys(plan: Partitioning, max_step: int) -> dict[str, Any]:
    """How the heat map's cells are keyed: by profiler step where any is known, else by bins
    of each group's sequence (at most 200 a group)."""
    import numpy as np

    if max_step >= 0:
        return {"by_step": True, "span": max_step + 2}
    _, low, high = parts.extents(plan, plan.surveys)
    span = np.maximum(high - low + 1, 1)
    return {"by_step": False, "seq_low": low, "seq_span": span,
            "bins": np.minimum(200, span), "span": 200}

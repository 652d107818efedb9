"""The analysis's passes over its partitions (``partitions``), run by an engine (``engines``),
and what the driver joins of them: the plan from the ranks' rows, the instances' facts, the
clocks, and — over every instance at once — the cause chains, the blame and each rank's
figures. Small results cross between the driver and the tasks (per-instance arrays, per-rank
sums, cells); launches never do."""

from __future__ import annotations

from typing import Any

from autoannot.traces import files
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
            group_desc[gid] = group_desc[gid] or str(g.get("desc", ""))
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
    everyone = list(range(len(plan.sources)))
    plan.spoilt = np.zeros(len(plan.reference["key"]), bool)
    for spoilt in _per_source(engine, parts.spoilt_by, plan, everyone, "checking"):
        plan.spoilt[spoilt] = True
    indexed = _per_source(engine, parts.index_source, plan, everyone, "indexing")
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
    if any(one is None for one in plan.surveys):
        plan.surveys = parts.surveys_of(got, width, len(plan.group_keys))
    max_step = int(np.max(got["step"], initial=-1))
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
        spoilt = ((got["collective"][shared] != ref["collective"][at])
                  | (got["size_bytes"][shared] != ref["size"][at]) | ~got["kernel"][shared])
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
    """Of the rows ``rows`` of ``got``: where each row's instance is in the reference, for the
    rows whose it is (their indices in ``got``). By arithmetic where the reference's groups'
    sequences are dense (``_dense_reference``), else by search."""
    import numpy as np

    group, seq = got["group"][rows], got["seq"][rows]
    dense = ref.get("dense")
    if dense is None:
        dense = ref["dense"] = _dense_reference(ref, int(group.max(initial=0)) + 1)
    if dense is False:
        key = (group.astype(np.int64) << SEQ_BITS) | seq
        at = np.searchsorted(ref["key"], key)
        np.minimum(at, len(ref["key"]) - 1, out=at)
        shared = np.flatnonzero(ref["key"][at] == key)
        return at[shared], shared + rows.start
    low, span, first, table = dense
    inside = group < len(low)
    g = np.where(inside, group, 0)
    offset = seq - np.take(low, g)
    inside &= (offset >= 0) & (offset < np.take(span, g))
    place = np.where(inside, offset + np.take(first, g), 0)
    at = np.take(table, place)
    shared = np.flatnonzero(inside & (at >= 0))
    return at[shared].astype(np.int64), shared + rows.start


def _dense_reference(ref: dict[str, Any], groups: int) -> Any:
    """(each group's lowest seq, its span, its first place, and the reference's index at each
    place: -1 where none) of the reference's launches; False where a table of their groups'
    sequences would be sparse."""
    import numpy as np

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


def run(plan: Partitioning, engine: Any, include_warmup: bool = False,
        target: int | None = None) -> Any:
    """Every pass of the analysis of ``plan``'s rows on ``engine``: an ``Analysis``. In
    partitions of about ``target`` launches; where none is given, a job of up to
    ``IN_MEMORY_LAUNCHES`` launches that this process runs is one partition, read once."""
    import numpy as np

    from autoannot.traces.analysis.results import far_clocks_note

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
    joined = _join_matched(plan, [m for m, _ in done])
    analysis = _analysis(plan, joined, fits, include_warmup)
    note = far_clocks_note(analysis)
    if note:
        analysis.notes.append(note)
    _join_figured(analysis, plan, joined, [f for _, f in done], window_starts)
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


def _join_matched(plan: Partitioning, matched: list[parts.Matched]) -> dict[str, Any]:
    """The instances of every partition, in partition order (each in (group, seq) order)."""
    import numpy as np

    joined = {name: np.concatenate([getattr(m, name) for m in matched])
              for name in ("key", "collective", "size_bytes", "members", "needed", "step",
                           "dtype", "kernel")}
    joined["bases"] = np.concatenate([[0], np.cumsum([len(m.key) for m in matched])])
    joined["conflicts"] = np.sort(np.concatenate([m.conflicts for m in matched]))
    joined["by_key"] = np.argsort(joined["key"], kind="stable")
    joined["keys"] = (joined["key"][joined["by_key"]], joined["by_key"])
    return joined


def lookup(keys: tuple[Any, Any], wanted: Any) -> Any:
    """The instance of each key ``wanted``; -1 where there is none (no valid instance).
    ``keys``: the instances' keys sorted, and the order that sorts them."""
    import numpy as np

    sorted_keys, order = keys
    if not len(sorted_keys):
        return np.full(len(wanted), -1, np.int64)
    at = np.minimum(np.searchsorted(sorted_keys, wanted), len(sorted_keys) - 1)
    return np.where(sorted_keys[at] == wanted, order[at], -1)


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


def _analysis(plan: Partitioning, joined: dict[str, Any], fits: list[Any],
              include_warmup: bool) -> Any:
    import numpy as np

    from autoannot.traces.analysis.results import Analysis, Figures, Instances

    n = len(joined["key"])
    table = Figures.empty(n)
    table.group = (joined["key"] >> SEQ_BITS).astype(np.int32)
    table.collective = joined["collective"]
    table.size_bytes = joined["size_bytes"]
    table.members = joined["members"]
    table.needed = joined["needed"]
    table.step = joined["step"]
    table.dtype = joined["dtype"]
    table.group_names, table.group_descs = plan.group_keys, plan.group_desc
    table.collective_names = plan.collective_names
    table.dtype_names = plan.dtype_names
    seq = joined["key"] & ((1 << SEQ_BITS) - 1)
    analysis = Analysis(Instances(table, seq, joined["kernel"]), fits,
                        _problems(plan, joined), plan.ranks, warmup_counted=include_warmup)
    analysis.site_names = plan.site_names
    analysis.table, analysis.seq = table, seq
    analysis.plan, analysis.bases = plan, joined["bases"]
    analysis.keys = joined["keys"]
    analysis.read_partition = lambda k: launches_of_partition(plan, k)
    return analysis


def _problems(plan: Partitioning, joined: dict[str, Any]) -> list[str]:
    """The instances the ranks launched differently, one by one (up to ``LISTED_PROBLEMS``);
    those some member ranks have no record of, one line per group."""
    import numpy as np

    from autoannot.traces.analysis.results import LISTED_PROBLEMS, count, disagreement

    problems: list[str] = []
    bad = joined["conflicts"]
    for key in bad[:LISTED_PROBLEMS].tolist():
        problems.append(disagreement(plan.group_keys[key >> SEQ_BITS],
                                     key & ((1 << SEQ_BITS) - 1),
                                     "on the collective or its size"))
    if len(bad) > LISTED_PROBLEMS:
        problems.append(f"... and {len(bad) - LISTED_PROBLEMS} more instances the ranks "
                        "disagree on")
    short = joined["by_key"][(joined["members"] < joined["needed"])[joined["by_key"]]]
    keys = joined["key"][short]
    for group_code in np.unique(keys >> SEQ_BITS).tolist():
        mine = short[(keys >> SEQ_BITS) == group_code]
        seqs = (joined["key"][mine] & ((1 << SEQ_BITS) - 1)).tolist()
        size = int(joined["needed"][mine[0]])
        fewest = int(joined["members"][mine].min())
        shown = ", ".join(f"#{s}" for s in seqs[:5]) + (", ..." if len(seqs) > 5 else "")
        problems.append(
            f"group {plan.group_keys[group_code]}: {count(len(seqs), 'collective')} ({shown}) "
            f"some of its {size} ranks have no trace or record of (down to {fewest} present): "
            "lined up on the ranks present")
    return problems


def _join_figured(analysis: Any, plan: Partitioning, joined: dict[str, Any],
                  figured: list[parts.Figured], window_starts: Any = None) -> None:
    """The figures of every partition in one table, then what needs every instance at once:
    where each delay began (cause chains), the blame, each rank's figures, missing ranks.
    Warm-up: profiler step 0 and each group's first instance; where no step is known, also
    the instances at ``window_starts`` (each rank's first of a group in its inputs)."""
    import numpy as np

    table = analysis.table
    n = len(joined["key"])
    width = plan.width
    bases = joined["bases"]
    last = np.concatenate([f.last for f in figured])
    skew = np.concatenate([f.skew for f in figured])
    straggler = np.concatenate([f.straggler for f in figured]).astype(np.int32)
    transfer = np.concatenate([f.transfer for f in figured])
    total = np.concatenate([f.total for f in figured])
    analysis.straggler_site = np.concatenate([f.straggler_site for f in figured])
    analysis.straggler_column = straggler
    late_at = np.concatenate([f.late + bases[k] for k, f in enumerate(figured)])
    chain = {name: np.concatenate([f.chain[name] for f in figured if f.chain])
             if any(f.chain for f in figured) else np.zeros(0)
             for name in ("straggler_prev_key", "straggler_prev_end", "straggler_start",
                          "first_prev_key", "first_prev_end", "first_start")}
    bare = sum(f.bare for f in figured)
    if bare:
        analysis.notes.append(
            f"{bare} launches are known by their entry times alone (record files): there "
            "is no transfer time for them, and their waits are bounded by the rank's next "
            "entry only (upper bounds)")
    table.warmup = (table.step == 0) | (analysis.seq == 0)
    if window_starts is not None and len(window_starts):
        table.warmup |= (table.step < 0) & np.isin(joined["key"], window_starts)
    late = skew >= parts.IN_STEP_US
    # the lateness each late instance's straggler carried in from its previous collective:
    # how much later it left that one than the first rank to arrive left its own
    came_from = lookup(joined["keys"], chain["straggler_prev_key"].astype(np.int64))
    first_from = lookup(joined["keys"], chain["first_prev_key"].astype(np.int64))
    known_late = (came_from >= 0) & (first_from >= 0)

    def left(end: Any, instance: Any, start: Any) -> Any:
        """When a previous launch left its collective: its end; where only its entry is
        known, the last arrival there, or the next launch's entry where that came first."""
        return np.where(np.isnan(end), np.fmin(last[np.maximum(instance, 0)], start), end)

    carried = np.zeros(n)
    known = np.zeros(n, bool)
    here = late_at[known_late]
    known[here] = True
    source = came_from[known_late]
    carried[here] = np.clip(
        left(chain["straggler_prev_end"][known_late], source,
             chain["straggler_start"][known_late])
        - left(chain["first_prev_end"][known_late], first_from[known_late],
               chain["first_start"][known_late]),
        0.0, np.minimum(skew[here], skew[source]))
    previous = np.full(n, -1, np.int64)
    previous[here] = source
    # the cause of each late instance: its own straggler, or the cause of the instance the
    # straggler came from where most of its lateness was carried from there
    parent = np.arange(n)
    inherits = known & (carried > skew - carried)
    parent[inherits] = previous[inherits]
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
    carried_to = np.where(known, root[np.maximum(previous, 0)], -1)
    moved = counted & (carried_to >= 0)
    if not analysis.warmup_counted:  # (a delay that began in warm-up is warm-up's)
        moved &= ~table.warmup[np.maximum(carried_to, 0)]
    blame += np.bincount(carried_to[moved], weights=(total * share)[moved], minlength=n)
    table.skew, table.last, table.transfer = skew, last, transfer
    table.straggler = np.where(late, straggler, -1).astype(np.int32)
    table.cause = np.where(late, root, -1)
    table.carried, table.blame = carried, blame
    waited = np.sum([f.waited for f in figured], axis=0) if figured else np.zeros(width)
    caused = np.bincount(straggler[blame > 0], weights=blame[blame > 0], minlength=width)
    times_late = np.bincount(straggler[counted], minlength=width)
    analysis.ranks_figures = [
        {"rank": r, "waited_us": round(float(waited[c]), 3),
         "others_waited_for_it_us": round(float(caused[c]), 3),
         "last_to_arrive": int(times_late[c])} for c, r in enumerate(analysis.ranks)]
    analysis.cells = parts.merge_cells([f.cells for f in figured])
    analysis.heat = plan.heat
    if len(figured) == 1 and figured[0].launch is not None:
        analysis.keep_partition(0, figured[0].launch)
    analysis.missing = _missing(analysis, plan, joined,
                                np.concatenate([f.reached for f in figured]))


def _missing(analysis: Any, plan: Partitioning, joined: dict[str, Any],
             reached: Any) -> list[dict[str, Any]]:
    """Per group whose ranks did not all leave a record of it, or did not all reach its last
    instance: the ranks with no record at all, and the last instance each present rank
    reached (a hang's shape: the ranks stuck in one collective, the rank that never came)."""
    import numpy as np

    from autoannot.traces.analysis.results import natural_key

    table, ranks = analysis.table, analysis.ranks
    found: list[dict[str, Any]] = []
    if not len(table.group):
        return found
    # a group whose last instance every member reached is whole: only the others are read
    by_key = joined["by_key"]
    group_sorted = table.group[by_key]
    last = by_key[np.flatnonzero(np.r_[group_sorted[1:] != group_sorted[:-1], True])]
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
    instance = lookup(joined["keys"], (reached[:, 0] << SEQ_BITS) | reached[:, 2])
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
        following = lookup(joined["keys"], np.array(
            [(g << SEQ_BITS) | (int(seq[i]) + 1) for i in behind.values()], np.int64))
        after = dict(zip(behind, following.tolist(), strict=True))
        found.append({
            "group": plan.group_keys[g], "group_desc": plan.group_desc[g], "size": size,
            "members": None if members is None else list(members),
            "no_record": absent, "no_record_unknown": unknown_absent,
            "reached": {"ranks": ahead, "seq": furthest,
                        "collective": table.collective_names[int(table.collective[top])],
                        "step": int(table.step[top]), "call_site": _site_of(analysis, top)},
            "behind": [{"rank": r, "seq": int(seq[i]),
                        "collective": table.collective_names[int(table.collective[i])],
                        "call_site": analysis.site(i, column[r]),
                        "next": None if after[r] < 0 else {
                            "collective": table.collective_names[
                                int(table.collective[after[r]])],
                            "call_site": _site_of(analysis, after[r])}}
                       for r, i in sorted(behind.items())]})
    return found


def _site_of(analysis: Any, instance: int) -> str | None:
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
    import numpy as np

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

"""Which columnar engine runs the one analysis: the matcher's core on the same launches in numpy,
polars, DuckDB and Arrow compute — wall time and peak memory, each engine in its own process.

    python benchmarks/engines.py [--ranks 8192] [--instances 2000] [--out FILE]

The core (``autoannot/traces/analysis/matching.py``): launches keyed by (group, seq, rank)
matched into instances (one sort), per instance the first and last arrival and the member
count; each launch's wait (last - its start); per rank, launches in time order and each one's
previous.
The launches are those of ``benchmarks/report_scale.py``: every rank in the default group and
its 8-rank tensor-parallel group.

Then the whole matcher, twice: as autoannot runs it (``matcher``: numpy) and with its
per-launch work in DuckDB SQL (``duckdb_matcher``: what a port would run), on the same
launches, each timed by a kernel: the same instances and the same total wait from both.
Prints one line of JSON per engine, then the summary. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

TP = 8


def launches(ranks: int, instances: int):  # -> dict of numpy arrays
    import numpy as np

    rng = np.random.default_rng(0)
    half = instances // 2
    rank = np.repeat(np.arange(ranks, dtype=np.int32), instances)
    seq = np.tile(np.concatenate([np.arange(half), np.arange(instances - half)]), ranks)
    in_tp = np.tile(np.arange(instances) >= half, ranks)
    group = np.where(in_tp, 1 + rank // TP, 0).astype(np.int64)
    start = 1e6 + 100.0 * np.tile(np.arange(instances), ranks) + rng.uniform(0, 1.5, rank.size)
    return {"rank": rank, "group": group, "seq": seq.astype(np.int64), "start": start}


def run_numpy(c):
    """As ``matching`` does it: one sort of a composite key; the timeline a stable sort by rank
    (radix) and a merge of each rank's runs."""
    import numpy as np

    rank_bits = max(1, int(c["rank"].max()).bit_length())
    seq_bits = max(1, int(c["seq"].max()).bit_length())
    composite = c["group"] << (seq_bits + rank_bits)
    composite |= c["seq"] << rank_bits
    composite |= c["rank"]
    order = np.argsort(composite)
    del composite
    key = (c["group"][order] << 40) | c["seq"][order]
    start = c["start"][order]
    head = np.ones(len(key), bool)
    head[1:] = key[1:] != key[:-1]
    heads = np.flatnonzero(head)
    first = np.minimum.reduceat(start, heads)
    last = np.maximum.reduceat(start, heads)
    members = np.diff(np.append(heads, len(key)))
    segment = np.cumsum(head) - 1
    wait = last[segment] - start
    rank = c["rank"][order]
    by_rank = np.argsort(rank, kind="stable")
    span = float(start.max() - start.min()) + 1.0
    by_time = by_rank[np.argsort(rank[by_rank] * span + (start[by_rank] - start.min()),
                                 kind="stable")]
    same = rank[by_time][1:] == rank[by_time][:-1]
    previous = np.full(len(start), -1)
    previous[by_time[1:][same]] = by_time[:-1][same]
    return len(heads), float(wait.sum()), int(members.max()), int((previous >= 0).sum()), first


def run_polars(c):
    import polars as pl

    frame = pl.DataFrame(c)
    instances = frame.group_by(["group", "seq"]).agg(
        pl.col("start").min().alias("first"), pl.col("start").max().alias("last"),
        pl.len().alias("members"))
    joined = frame.join(instances, on=["group", "seq"])
    wait = joined.select((pl.col("last") - pl.col("start")).sum()).item()
    timeline = frame.sort(["rank", "start"]).with_columns(
        pl.col("start").shift(1).over("rank").alias("previous"))
    return (instances.height, float(wait), int(instances["members"].max()),
            int(timeline["previous"].is_not_null().sum()), None)


def run_duckdb(c):
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads TO 2")
    import pyarrow as pa

    launches_table = pa.table(c)  # noqa: F841  (DuckDB reads it by name)
    instances = con.execute(
        "CREATE TABLE i AS SELECT \"group\", seq, min(start) AS first, max(start) AS last, "
        "count(*) AS members FROM launches_table GROUP BY ALL")
    count, members = con.execute("SELECT count(*), max(members) FROM i").fetchone()
    wait = con.execute("SELECT sum(i.last - t.start) FROM launches_table t "
                       "JOIN i USING (\"group\", seq)").fetchone()[0]
    previous = con.execute("SELECT count(p) FROM (SELECT lag(start) OVER (PARTITION BY rank "
                           "ORDER BY start) AS p FROM launches_table)").fetchone()[0]
    del instances
    return count, float(wait), int(members), int(previous), None


def run_arrow(c):
    import pyarrow as pa
    import pyarrow.compute as pc

    table = pa.table(c)
    instances = table.group_by(["group", "seq"]).aggregate(
        [("start", "min"), ("start", "max"), ("start", "count")])
    joined = table.join(instances, ["group", "seq"])
    wait = pc.sum(pc.subtract(joined["start_max"], joined["start"])).as_py()
    order = pc.sort_indices(table, [("rank", "ascending"), ("start", "ascending")])
    ranks = pc.take(table["rank"], order).to_numpy()
    previous = int((ranks[1:] == ranks[:-1]).sum())  # (no windowed shift in Arrow compute)
    return (instances.num_rows, float(wait), int(pc.max(instances["start_count"]).as_py()),
            previous, None)


def _launches_of(c):
    """The launches as flat arrays (every one timed by a kernel that ends 55 us after its
    instance's slot began: waits and transfers are real)."""
    import types

    import numpy as np

    n = len(c["rank"])
    return types.SimpleNamespace(
        group=c["group"].astype(np.int32), seq=c["seq"].astype(np.int64),
        column=c["rank"].astype(np.int32), collective=np.zeros(n, np.int32),
        size=np.full(n, 1 << 20, np.int64), site=np.full(n, -1, np.int32),
        start=c["start"], end=np.floor(c["start"] / 100) * 100 + 55,
        kernel=np.ones(n, bool), step=np.ones(n, np.int32), dtype=np.zeros(n, np.int16))


def run_matcher(c):
    """The whole matcher as autoannot runs it (``matching.analyze_rows``: instances, clocks,
    waits, carried lateness, causes, blame, per-rank figures), in numpy, in one partition."""
    import numpy as np

    from autoannot.traces.analysis import matching
    from autoannot.traces.table.rows import Rows

    launch = _launches_of(c)
    ranks = int(c["rank"].max()) + 1
    del c
    order = np.argsort(launch.column, kind="stable")
    bounds = np.searchsorted(launch.column[order], np.arange(ranks + 1))
    per_rank = []
    for rank in range(ranks):
        mine = order[bounds[rank]:bounds[rank + 1]]
        groups = [{"name": "0", "size": ranks}, {"name": str(1 + rank // TP), "size": TP}]
        local = np.where(launch.group[mine] == 0, 0, 1).astype(np.uint32)
        per_rank.append(Rows(rank, {
            "group": local, "seq": launch.seq[mine], "collective": launch.collective[mine],
            "size_bytes": launch.size[mine], "start_us": launch.start[mine],
            "end_us": launch.end[mine], "site": launch.site[mine],
            "kernel": launch.kernel[mine].astype(np.uint8), "step": launch.step[mine],
            "dtype": launch.dtype[mine].astype(np.uint32)}, groups, ["allreduce"], []))
    del launch, order
    analysis = matching.analyze_rows(per_rank, target=1 << 62)
    table = analysis.figures()
    return (len(table.group), float(sum(r["waited_us"] for r in analysis.per_rank())),
            int(table.members.max()), None, None)


def run_duckdb_matcher(c):
    """The same whole matcher's per-launch work in DuckDB SQL (instances by GROUP BY, clocks
    by median, the per-rank timeline by window functions), the per-instance chains in numpy:
    what a port would run."""
    import duckdb
    import numpy as np

    launch = _launches_of(c)
    width = int(c["rank"].max()) + 1
    del c
    con = duckdb.connect()
    con.execute("SET threads TO 2")
    L = {"col": launch.column, "grp": launch.group, "seq": launch.seq,
         "coll": launch.collective, "size": launch.size, "s0": launch.start, "f0": launch.end,
         "site": launch.site, "kernel": launch.kernel, "step": launch.step}
    con.execute("""CREATE TEMP TABLE inst AS
      SELECT grp, seq, count(*)::INTEGER AS members,
             (min(coll) <> max(coll) OR min(size) <> max(size)) AS conflict,
             bool_and(kernel) AS kernel, max(step) AS step, arg_min(coll, col) AS coll
      FROM L GROUP BY grp, seq""")
    con.execute("""CREATE TEMP TABLE vi AS
      SELECT grp, seq, (row_number() OVER (ORDER BY grp, seq) - 1)::INTEGER AS inst, kernel
      FROM inst WHERE NOT conflict""")
    con.execute("""CREATE TEMP TABLE T AS
      SELECT vi.inst, L.col, L.s0, L.f0, L.site, vi.kernel FROM L JOIN vi USING (grp, seq)""")
    del L, launch
    fits = con.execute("""WITH est AS (
        SELECT m.col, m.f0 - r.f0 AS e FROM T m JOIN T r ON m.inst = r.inst AND r.col = 0
        WHERE m.kernel AND m.col <> 0 AND NOT isnan(m.f0) AND NOT isnan(r.f0)),
      o AS (SELECT col, median(e) AS off FROM est GROUP BY col)
      SELECT o.col, o.off, median(abs(est.e - o.off)) AS spread
      FROM est JOIN o USING (col) GROUP BY o.col, o.off""").fetchnumpy()
    shift = np.zeros(width)
    applied = np.abs(fits["off"]) > np.maximum(1.0, 3 * fits["spread"])
    shift[fits["col"][applied]] = fits["off"][applied]
    sh = {"col": np.arange(width, dtype=np.int32), "shift": shift}  # noqa: F841
    con.execute("""CREATE TEMP TABLE W AS
      WITH t AS (SELECT inst, col, s0 - shift AS s, f0 - shift AS f, site
                 FROM T JOIN sh USING (col)),
      a AS (SELECT inst, min(s) AS first, max(s) AS last FROM t GROUP BY inst),
      b AS (SELECT t.inst, any_value(a.last) AS last,
                   max(col) FILTER (WHERE s = a.last) AS straggler,
                   min(col) FILTER (WHERE s = a.first) AS first_col,
                   arg_max(f, col) FILTER (WHERE s = a.last) - any_value(a.last) AS transfer
            FROM t JOIN a USING (inst) GROUP BY t.inst),
      w AS (SELECT t.inst, t.col, t.s, t.f, t.site, b.straggler, b.first_col,
                   lead(t.s) OVER r AS next_s, lag(t.inst) OVER r AS prev_inst,
                   least(b.last, t.f - CASE WHEN isnan(b.transfer) THEN 0 ELSE b.transfer END)
                     - t.s AS w0,
                   CASE WHEN isnan(t.f)
                        THEN least(b.last, coalesce(lead(t.s) OVER r, 'nan'::DOUBLE))
                        ELSE t.f END AS lv
            FROM t JOIN b USING (inst) WINDOW r AS (PARTITION BY t.col ORDER BY t.s, t.inst))
      SELECT inst, col, s, f, site, straggler, first_col, prev_inst,
             lag(lv) OVER (PARTITION BY col ORDER BY s, inst) AS prev_left,
             greatest(CASE WHEN isnan(f) AND next_s IS NOT NULL THEN least(w0, next_s - s)
                           ELSE w0 END, 0) AS wait
      FROM w""")
    per_launch = con.execute("SELECT col, s, f, site, wait FROM W ORDER BY inst, col"
                             ).fetchnumpy()
    per_instance = con.execute("""SELECT inst, count(*) AS members, sum(wait) AS total,
        any_value(prev_left) FILTER (WHERE col = straggler) AS left_last,
        any_value(prev_inst) FILTER (WHERE col = straggler) AS came_from,
        any_value(prev_left) FILTER (WHERE col = first_col) AS left_first
        FROM W GROUP BY inst ORDER BY inst""").fetchnumpy()
    return (len(per_instance["inst"]), float(per_launch["wait"].sum()),
            int(per_instance["members"].max()), None, None)


ENGINES = {"numpy": run_numpy, "polars": run_polars, "duckdb": run_duckdb, "arrow": run_arrow,
           "matcher": run_matcher, "duckdb_matcher": run_duckdb_matcher}


#: The engines of the core alone; the others run the whole matcher.
CORE = ("numpy", "polars", "duckdb", "arrow")


def child(engine: str, ranks: int, instances: int) -> None:
    columns = launches(ranks, instances)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    count, wait, members, previous, _ = ENGINES[engine](columns)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"engine": engine, "seconds": round(seconds, 2),
                      "peak_mib": round(peak), "added_mib": round(peak - base),
                      "instances": count, "wait_sum_us": round(wait, 1),
                      "most_members": members, "with_previous": previous}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8192)
    parser.add_argument("--instances", type=int, default=2000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help="also write the results here (JSON)")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.ranks, args.instances)
        return 0
    results = []
    for engine in ENGINES:
        done = subprocess.run([sys.executable, __file__, "--child", engine, "--ranks",
                               str(args.ranks), "--instances", str(args.instances)],
                              capture_output=True, text=True)
        if done.returncode:
            print(f"{engine}: failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        results.append(json.loads(done.stdout))
        print(done.stdout.strip())
    core = {(r["instances"], r["most_members"], r["with_previous"]) for r in results
            if r["engine"] in CORE}
    whole = {(r["instances"], r["most_members"], round(r["wait_sum_us"], -2)) for r in results
             if r["engine"] not in CORE}
    summary = {"ranks": args.ranks, "instances_per_rank": args.instances,
               "launches": args.ranks * args.instances,
               "same_answers": len(core) == 1 and len(whole) == 1,
               "results": results}
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(summary, handle, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

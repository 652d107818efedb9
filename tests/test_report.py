"""Issue 30: rows written in the job, and ``autoannot report``'s page — on a real 4-rank gloo job
(``AUTOANNOT=1``, ``AUTOANNOT_RECORD``, one profiled step, rank 2 late at one collective), checked
in a real browser (Debian's headless Chromium)."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from harness import run_job

from autoannot import cli
from autoannot.traces.analysis import lineup, matching
from autoannot.traces.read import rank_files
from autoannot.traces.render import skew
from autoannot.traces.table import rows

LATE_RANK, SLEEP_S, STEPS, PROFILED = 2, 0.25, 5, 3


def train_with_one_profiled_step(rank: int, world: int, out: str) -> dict:
    """Five steps of three collectives (the default group, and a pair group); step 3 is
    profiled (torch.profiler's schedule: wait, warm up, one active step), and in it rank 2
    sleeps before the all-reduce. The agent and the record file come from the environment
    (AUTOANNOT=1 at start-up, as users run it)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    import autoannot

    assert autoannot.is_enabled()
    pair = dist.new_group([0, 1]), dist.new_group([2, 3])
    mine = pair[rank // 2]
    grads, weights = torch.ones(1 << 12), torch.zeros(1 << 10)
    line = 0
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=PROFILED - 1, warmup=1, active=1, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/rank{rank}.json")) \
            as prof:
        for step in range(STEPS):
            dist.broadcast(weights, src=0)
            if step == PROFILED and rank == LATE_RANK:
                time.sleep(SLEEP_S)
            line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
            dist.all_reduce(grads)
            dist.all_reduce(weights, group=mine)
            prof.step()
    return {"line": line}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, int]:
    out = tmp_path_factory.mktemp("job")
    results = run_job(train_with_one_profiled_step, 4, out, (str(out),))
    return out, results[0]["line"]


@pytest.fixture(scope="module")
def binary(job, tmp_path_factory) -> Path:
    """The job's rows in autoannot's own columns (what a job without pyarrow writes)."""
    out, _ = job
    folder = tmp_path_factory.mktemp("binary")
    for rank in range(4):
        rows.write(rows.read(out / f"rank{rank}.rows.parquet"), folder / f"rank{rank}.rows")
    return folder


def test_every_rank_writes_its_rows_at_export(job, binary) -> None:
    out, line = job
    made = sorted(out.glob("*.rows.parquet"))  # (pyarrow is here: Parquet)
    assert [p.name for p in made] == [f"rank{r}.rows.parquet" for r in range(4)]
    for rank, path in enumerate(made):
        one = rows.read(path)
        assert one.rank == rank and one.source == f"rank{rank}.json"
        assert one.run and one.run == rows.read(made[0]).run  # the job's one run
        # the profiled step: a broadcast and two all-reduces (gloo's CPU ranges, named by the
        # record file)
        assert len(one) == 3
        names = [one.collectives[c] for c in one.columns["collective"]]
        assert names == ["broadcast", "allreduce", "allreduce"]
        sites = [one.sites[s] for s in one.columns["site"] if s >= 0]
        assert f"{__file__}:{line}" in sites
        assert all(e >= s for s, e in zip(one.columns["start_us"], one.columns["end_us"],
                                          strict=True))
        assert [one.dtypes[d] for d in one.columns["dtype"]] == ["Float"] * 3
        assert one.groups[0]["ranks"] == [0, 1, 2, 3]
        # without pyarrow: the same rows in autoannot's own columns, 53 bytes a row
        plain = binary / f"rank{rank}.rows"
        column_bytes = plain.stat().st_size - len(rows.MAGIC) - len(
            plain.read_bytes().split(b"\n")[1]) - 1
        width = sum(rows._WIDTH[code] for _, code in rows.COLUMNS)
        assert column_bytes == width * len(one) == 53 * 3
        again = rows.read(plain)
        assert {k: list(v) for k, v in again.columns.items()} == {
            k: list(v) for k, v in one.columns.items()}


def test_rows_are_read_by_pandas_and_duckdb_without_autoannot(job) -> None:
    """Issue 37: the job's rows are a table any tool reads; no autoannot module is imported."""
    out, line = job
    script = f"""
import sys, glob, json
import duckdb, pandas as pd
files = sorted(glob.glob({str(out / "*.rows.parquet")!r}))
frame = pd.concat(map(pd.read_parquet, files))
late = frame[frame.call_site.str.endswith(":{line}")]
by_rank = duckdb.sql("SELECT rank, count(*) AS n, min(step) AS step FROM frame "
                     "GROUP BY rank ORDER BY rank").fetchall()
print(json.dumps({{"rows": len(frame), "columns": list(frame.columns),
                  "late_ranks": sorted(set(late["rank"].tolist())), "by_rank": by_rank,
                  "timed_by": sorted(set(frame.timed_by)),
                  "autoannot": [m for m in sys.modules if m.startswith("autoannot")]}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items()
                                            if not k.startswith("AUTOANNOT")})
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout)
    assert said["autoannot"] == []
    assert said["rows"] == 4 * 3 and said["columns"] == [n for n, _ in rows.PARQUET_COLUMNS]
    assert said["late_ranks"] == [0, 1, 2, 3]  # every rank's all-reduce at that line
    assert said["by_rank"] == [[r, 3, PROFILED] for r in range(4)]
    assert said["timed_by"] == ["cpu"]


def test_rows_answer_as_the_traces_and_record_files_they_came_from(job) -> None:
    """The same instances, stragglers and waits from the rows (whole-array matching) as from the
    traces and record files (skew's own path)."""
    out, _ = job
    from_files = lineup.analyze_files(sorted(out.glob("rank?.json")), sorted(out.glob("*.jsonl")))
    # the record files hold all five steps; the traces one: the rows hold that one
    from_rows = lineup.analyze_files([], [], rows=sorted(out.glob("*.rows.parquet")))
    assert from_rows.rows() == from_files.rows()
    assert from_rows.per_rank() == from_files.per_rank()
    assert skew.format_report(from_rows) == skew.format_report(from_files)
    # the page's tables, from either
    from autoannot.traces.render import report

    assert report.stragglers(from_rows) == report.stragglers(from_files)
    by_key = lambda rows: sorted(rows, key=lambda r: (r["group"], r["collective"]))  # noqa: E731
    assert by_key(report.group_rows(from_rows)) == by_key(report.group_rows(from_files))
    late = max(from_rows.rows(), key=lambda r: r["skew_us"])
    assert late["straggler"] == LATE_RANK and late["collective"] == "allreduce"
    assert abs(late["skew_us"] - SLEEP_S * 1e6) < 0.2 * SLEEP_S * 1e6


def test_report_names_the_straggler_on_the_page(job, tmp_path: Path, capsys) -> None:
    out, line = job
    page = tmp_path / "report.html"
    assert cli.main(["report", str(out), "-o", str(page), "-q"]) == 0
    said = capsys.readouterr()
    assert f"rank {LATE_RANK} held the others up most" in said.out
    assert "traces read through the rows" in said.err  # the folder's traces: their rows
    text = page.read_text()
    lead = re.search(r'<p class="lead" id="straggler">(.*?)</p>', text).group(1)
    assert lead.startswith(f"rank {LATE_RANK} held the others up most")
    assert f"{Path(__file__).name}:{line}" in lead
    assert 'id="verdict">Yes' in text
    assert "https://" not in text.split("<script>")[0]  # nothing fetched: one file
    # a second run writes over its own page; a file autoannot did not write is refused
    assert cli.main(["report", str(out), "-o", str(page), "-q"]) == 0
    mine = tmp_path / "mine.html"
    mine.write_text("my notes")
    assert cli.main(["report", str(out), "-o", str(mine), "-q"]) == 2
    assert mine.read_text() == "my notes"


def test_report_takes_traces_and_record_files_alone_too(job, tmp_path: Path) -> None:
    out, _ = job
    for pattern, code in (("rank?.jsonl", 0), ("rank?.json", 0)):
        page = tmp_path / f"{pattern[5:].replace('.', '')}.html"
        inputs = [str(p) for p in sorted(out.glob(pattern))]
        # record files: all five steps, entry times only; traces named as files: read through
        # the rows beside them, as their folder is (issue 37: the same files, one answer)
        assert cli.main(["report", *inputs, "-o", str(page), "-q"]) == code
        if code == 0:  # rank 2 among the stragglers, late at its worst by the sleep at least
            # (the record files hold all five steps: on a loaded machine a rank may be late by
            # more elsewhere, and another rank more often)
            text = page.read_text()
            table = text.split('class="stragglers"')[1].split("</table>")[0]
            unit = re.search(r"late by \((\w+)\)", table).group(1)
            mine = re.search(rf"<tr><td>{LATE_RANK}</td>.*?</tr>", table).group(0)
            late_by = float(re.findall(r"<td>(.*?)</td>", mine)[4])
            assert late_by * (1e3 if unit == "ms" else 1) > 0.8 * SLEEP_S * 1e6, mine
            assert "unknown" in text  # no transfer from entry times


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def _chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *BROWSER_FLAGS, f"--user-data-dir={profile}",
                           "--virtual-time-budget=15000", *extra, page.as_uri()],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (.ci/run installs Debian's)")
def test_the_page_renders_in_a_real_browser(job, tmp_path: Path) -> None:
    """Debian's headless Chromium, offline: every figure drawn, no script error, the straggler
    on the page; a screenshot."""
    out, _ = job
    page = tmp_path / "report.html"
    assert cli.main(["report", str(out), "-o", str(page), "-q"]) == 0
    dom = _chromium(page, tmp_path / "profile", "--dump-dom").stdout
    body = re.search(r"<body([^>]*)>", dom).group(1)
    attributes = dict(re.findall(r'data-([a-z]+)="([^"]*)"', body))
    assert "errors" not in attributes, attributes.get("errors")
    assert attributes["figures"] == attributes["drawn"] == "2"  # heat map and timeline
    assert f"rank {LATE_RANK} held the others up most" in dom
    assert dom.count("main-svg") >= 2  # plotly drew its SVG
    shot = tmp_path / "report.png"
    _chromium(page, tmp_path / "profile2", f"--screenshot={shot}", "--window-size=1280,1800")
    assert shot.stat().st_size > 20_000  # a picture, not a blank page
    with open(shot, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_damaged_rows_file_is_refused_with_its_name(job, binary, tmp_path: Path,
                                                      capsys) -> None:
    broken = tmp_path / "rank0.rows.parquet"
    broken.write_bytes((job[0] / "rank0.rows.parquet").read_bytes()[:-20])
    assert cli.main(["skew", str(broken), str(job[0] / "rank1.rows.parquet")]) == 2
    assert f"{broken}: not autoannot's Parquet rows, or damaged" in capsys.readouterr().err
    out = binary
    cut = tmp_path / "rank0.rows"
    cut.write_bytes((out / "rank0.rows").read_bytes()[:-5])
    assert cli.main(["skew", str(cut), str(out / "rank1.rows")]) == 2
    assert f"{cut}: cut short or damaged" in capsys.readouterr().err
    other = tmp_path / "rank1.rows"
    data = (out / "rank1.rows").read_bytes()
    head_end = data.index(b"\n", len(rows.MAGIC))
    head = json.loads(data[len(rows.MAGIC):head_end])
    head["version"] = 9
    other.write_bytes(rows.MAGIC + json.dumps(head).encode() + data[head_end:])
    assert cli.main(["skew", str(out / "rank0.rows"), str(other)]) == 2
    assert "rows of version 9" in capsys.readouterr().err


def test_whole_array_matching_says_what_does_not_match(job) -> None:
    """A rank whose rows lack one instance, and one that disagrees on a size: both named, the
    rest matched."""
    out, _ = job
    ranks = [rows.read(p, numpy=True) for p in sorted(out.glob("*.rows.parquet"))]
    import numpy as np

    sizes = np.array(ranks[1].columns["size_bytes"])
    sizes[2] += 4  # rank 1's pair all-reduce
    ranks[1].columns["size_bytes"] = sizes
    ranks[3].columns = {k: v[1:] for k, v in ranks[3].columns.items()}  # no broadcast
    analysis = matching.analyze_rows(ranks)
    # the broadcast rank 3 has no record of is lined up on the three present, and said
    assert [(i.group, i.collective) for i in analysis.instances] == [
        ("0", "broadcast"), ("0", "allreduce"), ("2", "allreduce")]
    assert analysis.figures().members.tolist()[0] == 3
    assert len(analysis.problems) == 2
    assert "the ranks disagree" in analysis.problems[0] and "group 1" in analysis.problems[0]
    assert analysis.problems[1].startswith("group 0: 1 collective (#6) some of its 4 ranks "
                                           "have no trace or record of (down to 3 present)")


def test_a_mix_of_rows_and_record_files_is_lined_up_on_one_clock(job) -> None:
    """Ranks 0 and 1 by their rows (the trace's time base), ranks 2 and 3 by their record files
    (entry times on the wall clock): put on one epoch, the late all-reduce is rank 2's, by the
    sleep; the other steps, which only the record files hold, are named as left out."""
    out, _ = job
    analysis = lineup.analyze_files([], [out / "rank2.jsonl", out / "rank3.jsonl"],
                                  rows=[out / "rank0.rows.parquet",
                                        out / "rank1.rows.parquet"])
    # (the default group: the pair of ranks 2 and 3 holds all five steps, from records alone)
    default = [r for r in analysis.rows() if r["group"] == "0"]
    late = max((r for r in default if len(r["ranks"]) == 4), key=lambda r: r["skew_us"])
    assert late["straggler"] == LATE_RANK and late["collective"] == "allreduce"
    assert abs(late["skew_us"] - SLEEP_S * 1e6) < 0.2 * SLEEP_S * 1e6
    others = [r for r in default if r["seq"] != late["seq"] and len(r["ranks"]) == 4]
    assert others and all(r["skew_us"] < 0.2 * SLEEP_S * 1e6 for r in others)
    # the steps only ranks 2 and 3 hold (their record files): lined up on them, and named
    assert any(len(r["ranks"]) == 2 for r in default)
    assert any("have no trace or record of" in p for p in analysis.problems)


def test_check_compares_rows_over_the_stretch_every_rank_holds(job, binary, tmp_path: Path,
                                                               capsys) -> None:
    out, _ = job
    assert cli.main(["check", *map(str, sorted(out.glob("*.rows.parquet")))]) == 0
    assert "3 sequences" in capsys.readouterr().out  # the default group and the two pairs
    # rank 1 launched another size in its pair's all-reduce: named, with its call site
    import numpy as np

    out = binary  # (the same rows, in autoannot's own columns)
    one = rows.read(out / "rank1.rows", numpy=True)
    sizes = np.array(one.columns["size_bytes"])
    sizes[2] *= 2
    one.columns = {**one.columns, "size_bytes": sizes}
    changed = tmp_path / "rank1.rows"
    rows.write(one, changed)
    paths = [out / "rank0.rows", changed, out / "rank2.rows", out / "rank3.rows"]
    assert cli.main(["check", *map(str, paths)]) == 1
    said = capsys.readouterr().out
    assert "DIVERGES" in said and "group 1" in said and "8192 B" in said


def test_rows_of_a_graphed_trace_are_written_through_its_ledger(tmp_path: Path) -> None:
    """What a rank does at export for a raw graphed trace (the committed 2 x H200 rank 1 and
    its ledger): its rows are the annotated trace's, and no temporary is left beside it."""
    import agent_hooks as hooks

    from autoannot.live import export
    from autoannot.traces.read import annotate

    data = Path(__file__).parent / "data" / "gpu" / "graphs"
    for name in ("graph_rank1.json", "graph_rank1.autoannot"):
        shutil.copy(data / name, tmp_path / name)
    written = export.write_rows(str(tmp_path / "graph_rank1.json"), hooks.AGENT)
    assert written == str(tmp_path / "graph_rank1.rows.parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "graph_rank1.autoannot", "graph_rank1.json", "graph_rank1.rows.parquet"]
    annotated = tmp_path / "elsewhere" / "graph_rank1.json"
    annotated.parent.mkdir()
    annotate.annotate_file(tmp_path / "graph_rank1.json", annotated)
    expected = rank_files.rows_of_trace(annotated)
    got = rows.read(Path(written))
    assert got.rank == 1 and len(got) == len(expected) == 36
    assert {k: list(v) for k, v in got.columns.items()} == {
        k: list(v) for k, v in expected.columns.items()}
    assert got.collectives == expected.collectives
    # each group as the trace says it, with its launches and seq range here (the extents an
    # analysis cuts its partitions by)
    assert [{k: v for k, v in g.items() if k not in ("launches", "seq")}
            for g in got.groups] == expected.groups
    for code, g in enumerate(got.groups):
        mine = [s for gc, s in zip(got.columns["group"], got.columns["seq"], strict=True)
                if gc == code]
        assert g["launches"] == len(mine) and g["seq"] == [min(mine), max(mine)]


def test_summary_reads_rows(job, tmp_path: Path, capsys) -> None:
    """Rows alone: per group, collective and size, the instances and the last rank's transfer;
    beside traces, the traces are summarized (they hold more) and that is said."""
    out, _ = job
    assert cli.main(["summary", "--json", *map(str, sorted(out.glob("*.rows.parquet")))]) == 0
    said = json.loads(capsys.readouterr().out)
    table = {(r["group"], r["collective"]): r for r in said["instance_rows"]}
    assert set(table) == {("0", "broadcast"), ("0", "allreduce"), ("1", "allreduce"),
                          ("2", "allreduce")}
    assert table[("0", "allreduce")]["ranks"] == 4 and table[("1", "allreduce")]["ranks"] == 2
    assert all(r["instances"] == 1 and r["median_transfer_us"] > 0 for r in table.values())
    # the transfer is not the waiting: the late all-reduce's is far below the sleep
    assert table[("0", "allreduce")]["median_transfer_us"] < 0.5 * SLEEP_S * 1e6
    assert cli.main(["summary", str(out)]) == 0
    assert "rows files beside the traces: summarized from the traces" in capsys.readouterr().err


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (.ci/run installs Debian's)")
def test_the_page_at_1024_ranks_names_the_planted_straggler(tmp_path: Path) -> None:
    """Issue 37: 1,024 ranks in groups of 8 (``benchmarks/report_scale.py``'s rows), one rank
    35 us late at every 10th collective of the default group: in a real browser, the lead
    names it, and the default group's heat map (members x steps, shown first) holds its
    late steps, 10x brighter than any other cell."""
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import report_scale

    planted = 613
    folder = tmp_path / "rows"
    folder.mkdir()
    report_scale.write_rows(folder, 1024, 200, straggler=planted)
    page = tmp_path / "report.html"
    assert cli.main(["report", "-q", str(folder), "-o", str(page)]) == 0
    dom = _chromium(page, tmp_path / "profile", "--dump-dom").stdout
    lead = re.search(r'<p class="lead" id="straggler">(.*?)</p>', dom).group(1)
    assert lead.startswith(f"rank {planted} held the others up most")
    assert 'data-drawn="2"' in dom and "data-errors" not in dom
    # the heat map shown first: the default group, 1,024 members; the planted rank's row
    import plotly.io as pio

    text = page.read_text()
    figure = pio.from_json(re.search(r'Plotly\.newPlot\(\s*"heat-map",\s*(\[.*?\]),\s*(\{.*?\})'
                                     r',\s*\{"displaylogo"', text, re.S).expand(
        r'{"data": \1, "layout": \2}'))
    shown = next(t for t in figure.data if t.visible is not False)
    # (1,024 members: 128 rows of 8 ranks, each cell the largest of its block)
    assert shown.name == "default_pg (0)" and len(shown.y) == 128
    import numpy as np

    z = shown.z
    if isinstance(z, dict):  # plotly's typed array: base64 of the values, with dtype and shape
        import base64

        z = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(
            [int(n) for n in str(z["shape"]).split(",")])
    cells = np.array(z, dtype=float)
    mine = shown.y.index(f"ranks {planted // 8 * 8}-{planted // 8 * 8 + 7}")
    others = np.delete(cells, mine, axis=0)
    # its 10 late steps (every 10th of 100 instances, 5 a step) stand 10x over every cell
    # of the 1,023 others
    assert (cells[mine] > 10 * np.nanmax(others)).sum() == 10
    # bandwidth: one row for the default group, one for its 128 tensor-parallel groups
    table = text.split('class="groups"')[1].split("</table>")[0]
    labels = re.findall(r"<tr><td>(.*?)</td>", table)
    assert labels == ["default_pg (0)", "tensor_parallel (128 groups: tp0 ... tp127)"]


def test_rows_of_version_1_still_read(tmp_path: Path, capsys) -> None:
    """Rows files written before steps and dtypes (version 1, made by 9141d7a from the committed
    2 x H200 graph traces: ``tests/data/rows_v1``) are read as they were: the same instances,
    stragglers and skews as the traces give now, with no step and no dtype known."""
    from autoannot.traces.read import annotate

    old = sorted((Path(__file__).parent / "data" / "rows_v1").glob("*.rows"))
    assert [json.loads(p.read_bytes().split(b"\n")[1])["version"] for p in old] == [1, 1]
    assert all(rows.read(p).columns["step"].tolist() == [-1] * 36 for p in old)
    from_old = lineup.analyze_files([], [], rows=old)
    data = Path(__file__).parent / "data" / "gpu" / "graphs"
    traces = []
    for rank in (0, 1):
        traces.append(tmp_path / f"graph_rank{rank}.json")
        annotate.annotate_file(data / f"graph_rank{rank}.json", traces[-1])
    from_traces = lineup.analyze_files(traces, [])
    assert len(from_old.instances) == len(from_traces.instances) == 36
    for a, b in zip(from_old.rows(), from_traces.rows(), strict=True):
        assert (a["group"], a["seq"], a["collective"], a["straggler"], a["skew_us"]) == (
            b["group"], b["seq"], b["collective"], b["straggler"], b["skew_us"])
        assert a["dtype"] == "" and a["step"] == -1
    assert cli.main(["skew", "-q", str(old[0].parent)]) == 0
    capsys.readouterr()

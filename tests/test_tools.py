"""The tools users reach for: summary (bandwidth checked by hand on a committed trace), plot,
doctor."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from autoannot import cli
from autoannot.agent import doctor
from autoannot.traces.render import summary

DATA = Path(__file__).parent / "data" / "gpu"
EAGER = [DATA / "graphs" / f"eager_rank{r}.json" for r in range(2)]


def by_hand(paths: list[Path], collective: str, group: str) -> tuple[float, float, int]:
    """(median transfer time in us, bytes, group size) of one collective, computed from the raw
    JSON: the n-th kernel of the group on each rank is one collective; its transfer is the
    kernel of the rank that started last (from the last arrival to the end)."""
    per_rank, size, ranks = [], None, None
    for path in paths:
        events = json.loads(path.read_text())["traceEvents"]
        ours, group_order = [], []
        for e in sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"]):
            args = e.get("args", {})
            if args.get("Process Group Name") == group and "Collective name" in args:
                group_order.append(e)
                if args["Collective name"] == collective:
                    ours.append(len(group_order) - 1)
                    elems = max(args["In msg nelems"], args["Out msg nelems"])
                    size = elems * {"Float": 4, "BFloat16": 2, "Long": 8,
                                    "Half": 2}[args["dtype"]]
                    ranks = args["Group size"]
        per_rank.append({i: group_order[i] for i in ours})
    transfers = []
    for position in per_rank[0]:
        last = max((kernels[position] for kernels in per_rank), key=lambda e: e["ts"])
        transfers.append(last["dur"])
    return statistics.median(transfers), size, ranks


def test_summary_bandwidth_matches_a_hand_computation() -> None:
    rows = summary.summarize(EAGER, progress=False).rows
    for collective, group, factor in (("allreduce", "0", lambda n: 2 * (n - 1) / n),
                                      ("_allgather_base", "1", lambda n: (n - 1) / n),
                                      ("broadcast", "1", lambda n: 1.0)):
        median_us, size, n = by_hand(EAGER, collective, group)
        row = next(r for r in rows if r["collective"] == collective
                   and r["group"].endswith(f"({group})") and r["size_bytes"] == size)
        algbw = size / (median_us * 1e-6) / 1e9
        assert row["transfer_us_median"] == pytest.approx(median_us)
        assert row["algbw_gbps"] == pytest.approx(algbw)
        assert row["busbw_gbps"] == pytest.approx(algbw * factor(n))
        assert row["ranks"] == 2


def test_summary_counts_graphed_replays_once_annotated(tmp_path: Path, capsys) -> None:
    from autoannot.traces.read import annotate as tracetool

    outs = []
    for r in range(2):
        out = tmp_path / f"annotated_rank{r}.json"
        tracetool.annotate_file(DATA / "graphs" / f"graph_rank{r}.json", out)
        outs.append(out)
    assert cli.main(["summary", "-q", *map(str, outs), "-o", str(tmp_path / "s.csv"),
                     "-o", str(tmp_path / "s.json")]) == 0
    rows = json.loads((tmp_path / "s.json").read_text())
    # 3 replays on both ranks (two same-size all_reduces on one group share a row: 6)
    assert all(r["count_min"] == r["count_max"] and r["count_max"] % 3 == 0 for r in rows)
    assert sum(r["count_max"] * r["ranks"] for r in rows) == 72  # every kernel of both ranks
    assert (tmp_path / "s.csv").read_text().startswith("group,collective,dtype")
    assert "busbw GB/s" in capsys.readouterr().out
    assert cli.main(["summary", "-q", str(DATA / "graphs" / "graph_rank0.json")]) == 1
    assert cli.main(["summary", str(tmp_path / "missing.json")]) == 2


def test_mesh_summary_reports_the_same_counts_and_sizes_per_group_on_every_rank(
        tmp_path: Path) -> None:
    from autoannot.traces.read import annotate as tracetool

    outs = []
    for r in range(4):
        out = tmp_path / f"rank{r}.json"
        tracetool.annotate_file(DATA / "mesh" / f"graph_rank{r}.json", out, lanes=True)
        outs.append(out)
    rows = summary.summarize(outs, progress=False).rows
    assert {r["collective"] for r in rows} == {"_reduce_scatter_base", "_allgather_base",
                                               "allreduce"}
    for out in outs:  # each group's collectives sit on that group's own lane
        events = json.loads(out.read_text())["traceEvents"]
        lanes: dict[str, set] = {}
        for e in events:
            if e.get("cat") == "kernel" and "Collective name" in e.get("args", {}):
                lanes.setdefault(e["args"]["Process Group Name"], set()).add(e["tid"])
        assert len(lanes) == 2 and all(len(t) == 1 for t in lanes.values())
        assert len({next(iter(t)) for t in lanes.values()}) == 2
    for row in rows:
        assert row["ranks"] == 2 and row["count_min"] == row["count_max"] == 3
    assert len({r["group"] for r in rows}) == 4  # 2 dp groups, 2 tp groups


def test_plot_draws_a_band_per_rank(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "timeline.png"
    assert cli.main(["plot", *map(str, EAGER), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from autoannot.traces.render import plot

    drawn = plot.plot(EAGER, tmp_path / "t.svg")
    assert drawn["ranks"] == 2 and drawn["lanes"] == 6  # compute + 2 groups, per rank
    assert cli.main(["plot", str(EAGER[0]), "-o", str(tmp_path / "x.bmp")]) == 2


def test_doctor_on_a_cpu_machine(capsys) -> None:
    report = doctor.diagnose()
    assert report["torch"] and report["wrapt"]
    assert report["path"] in ("torch toolsId", "autoannot fallback (capture ledgers)")
    assert report["compiled_code"].startswith("annotated")  # torch 2.13 takes our kernels
    from autoannot.observe import group_hooks

    assert report["cpp_origin"].startswith(
        "annotated through torch's process-group hooks" if group_hooks.available() else
        "annotated by the Python layer (a DeferredInit kernel")
    import torch

    graph_class = getattr(torch._C, "_CUDAGraph", None)  # what this torch offers
    if hasattr(graph_class, "get_currently_capturing_graph"):
        assert report["capture_identity"].startswith("torch's get_currently_capturing_graph")
    else:  # no CUDA here
        assert report["capture_identity"].startswith("the capturing thread")
    import torch

    if not torch.cuda.is_available():
        assert report["path"].startswith("autoannot fallback")
        assert any("no CUDA device" in m for m in report["missing"])
    assert cli.main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["autoannot"] == report["autoannot"]
    assert cli.main(["doctor"]) == 0
    assert "annotation path:" in capsys.readouterr().out


def test_jobs_change_nothing_but_the_time(tmp_path: Path, capsys) -> None:
    """``-j``: the same outputs, byte for byte, the same report order, the same exit codes."""
    from autoannot import cli

    traces = [str(DATA / "mesh" / f"graph_rank{r}.json") for r in range(4)]
    printed = {}
    for jobs in ("1", "2"):
        out = tmp_path / f"j{jobs}"
        assert cli.main(["annotate", *traces, "-o", str(out), "-j", jobs]) == 0
        printed[jobs] = capsys.readouterr().out.replace(str(out), "OUT")
    assert printed["1"] == printed["2"] and printed["1"].count(" -> OUT/") == 4
    for r in range(4):
        name = f"graph_rank{r}.json"
        assert (tmp_path / "j1" / name).read_bytes() == (tmp_path / "j2" / name).read_bytes()
    annotated = [str(tmp_path / "j1" / f"graph_rank{r}.json") for r in range(4)]
    rows = {}
    for jobs in ("1", "2"):
        assert cli.main(["summary", *annotated, "-q", "-j", jobs]) == 0
        rows[jobs] = capsys.readouterr().out
    assert rows["1"] == rows["2"]
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [')
    assert cli.main(["annotate", traces[0], str(broken), "-o", str(tmp_path / "x"),
                     "-j", "2"]) == 2
    assert "broken.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["summary", traces[0], "-j", "0"])
    assert exc.value.code == 2

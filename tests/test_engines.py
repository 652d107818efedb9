"""Issue 39: the one analysis in partitions, on this machine or on a Dask cluster, says the same
thing byte for byte; a Dask worker lost mid-run is retried by Dask, and a run that cannot
finish fails cleanly with nothing written.

Inputs: real 4-rank gloo jobs with a planted delay (``truth_jobs``: its rank, step and call
site known), and, for the killed workers, rows of 128 ranks with a late rank planted at every
10th instance (``benchmarks/report_scale.py``). Clusters are real: Dask's own scheduler and
worker processes on this machine (``distributed.LocalCluster``), killed with SIGKILL.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import truth_jobs as truth

from autoannot import cli
from autoannot.traces.analysis import lineup, matching
from autoannot.traces.table import rows

distributed = pytest.importorskip("distributed", reason="the Dask engine's extra")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, tuple[Path, list[dict]]]:
    made = {}
    for kind in ("chain", "hang"):
        out = tmp_path_factory.mktemp(kind)
        made[kind] = (out, truth.run(kind, out))
    return made


def _cluster(folder: Path, workers: int) -> Any:
    return distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                    memory_limit="1GB", dashboard_address=":0",
                                    local_directory=str(folder))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Any:
    with _cluster(tmp_path_factory.mktemp("dask"), 2) as made:
        yield made


def _answers(capsys, tmp_path: Path, name: str, *args: str) -> dict[str, Any]:
    """What skew (text, JSON on stdout, JSON and CSV files) and report (the page) say of the
    inputs, with ``args``; and their exit statuses."""
    out = tmp_path / name
    out.mkdir()
    found: dict[str, Any] = {"codes": []}
    found["codes"].append(cli.main(["skew", "-q", "--top", "50", *args]))
    found["text"] = capsys.readouterr().out
    found["codes"].append(cli.main(["skew", "-q", "--json", *args, "-o", str(out / "i.json"),
                                    "-o", str(out / "i.csv")]))
    found["json"] = capsys.readouterr().out
    found["codes"].append(cli.main(["report", "-q", *args, "-o", str(out / "page.html")]))
    capsys.readouterr()
    for written in ("i.json", "i.csv", "page.html"):
        found[written] = (out / written).read_bytes()
    return found


@pytest.mark.parametrize("kind", ["chain", "hang"])
def test_every_engine_says_the_same_byte_for_byte(jobs, cluster, capsys, tmp_path: Path,
                                                  kind: str) -> None:
    """One partition in this process; many partitions on a pool of this machine's processes;
    the same many on a Dask cluster: the text, the JSON, the CSV and the page are equal."""
    out, _ = jobs[kind]
    if kind == "chain":  # (rows files: read by row range)
        heads = [rows.read_head(p)[0] for p in sorted(out.glob("*.rows*"))]
        assert len(heads) == truth.WORLD
        assert matching.analyze_rows(heads, target=16).plan.partitions >= 4  # (really cut)
        assert matching.analyze_rows(heads).plan.partitions == 1
    else:  # (a hang leaves record files alone: their rows in memory, shipped to Dask)
        records = sorted(out.glob("*.jsonl"))
        assert len(records) == truth.WORLD
        assert lineup.analyze_files([], records, target=16).plan.partitions >= 4
    whole = _answers(capsys, tmp_path, "whole", str(out))
    cut = _answers(capsys, tmp_path, "cut", str(out), "--partition-launches", "16", "-j", "2")
    on_dask = _answers(capsys, tmp_path, "dask", str(out), "--partition-launches", "16",
                       "--engine", "dask", "--scheduler", cluster.scheduler_address)
    assert whole["codes"] == ([1, 1, 1] if kind == "hang" else [0, 0, 0])
    for name in ("codes", "text", "json", "i.json", "i.csv", "page.html"):
        assert cut[name] == whole[name], name
        assert on_dask[name] == whole[name], name


def test_the_planted_delay_is_found_on_dask(jobs, cluster, capsys) -> None:
    """The chain's delay (rank 1, its pair all-reduce, step 3) comes first, blamed once, on a
    Dask cluster in many partitions; the hang names the rank that never came."""
    out, results = jobs["chain"]
    dask = ["--engine", "dask", "--scheduler", cluster.scheduler_address,
            "--partition-launches", "16"]
    assert cli.main(["skew", "-q", "--json", str(out), *dask]) == 0
    said = json.loads(capsys.readouterr().out)
    planted = truth.PLANTED_RANK["chain"]
    top = said["origins"][0]
    assert (top["rank"], top["call_site"], top["step"]) == (
        planted, results[planted]["sites"]["pair"], truth.PLANTED_STEP)
    assert top["blamed_us"] == pytest.approx(truth.DELAY_S * 1e6 * (truth.WORLD - 1), rel=0.1)
    out, _ = jobs["hang"]
    assert cli.main(["skew", "-q", "--json", str(out), *dask]) == 1
    said = json.loads(capsys.readouterr().out)
    behind = said["missing"][0]["behind"]  # (furthest behind: the rank that left)
    assert min(behind, key=lambda b: b["seq"])["rank"] == truth.PLANTED_RANK["hang"]


def _write_rows(folder: Path, ranks: int, instances: int) -> Path:
    """``benchmarks/report_scale.py``'s rows: a late rank at every 10th default-group
    instance."""
    spec = importlib.util.spec_from_file_location(
        "report_scale", Path(__file__).parent.parent / "benchmarks" / "report_scale.py")
    assert spec is not None and spec.loader is not None
    scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scale)
    made = folder / "rows"
    made.mkdir()
    scale.write_rows(made, ranks, instances)
    return made


def _late_rows(folder: Path) -> Path:
    """128 ranks' rows, 8,000 instances each (1M launches), a late rank at every 10th."""
    return _write_rows(folder, 128, 8000)


def _kill_a_busy_worker(address: str, running: threading.Thread) -> dict[str, Any]:
    """SIGKILL the first worker seen running one of the analysis's tasks while the run is on;
    what was killed, and when."""
    with distributed.Client(address) as watcher:
        while running.is_alive():
            busy = {w: keys for w, keys in watcher.processing().items()
                    if any(str(k).startswith("_call_with") for k in keys)}
            if busy:
                worker = sorted(busy)[0]
                pid = watcher.run(os.getpid, workers=[worker])[worker]
                held = list(watcher.has_what().get(worker, ()))
                os.kill(pid, signal.SIGKILL)
                return {"worker": worker, "pid": pid, "running": busy[worker], "held": held}
            time.sleep(0.002)
    return {}


def _run_in_thread(argv: list[str]) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def go() -> None:
        result["code"] = cli.main(argv)

    thread = threading.Thread(target=go)
    thread.start()
    return thread, result


def test_a_worker_killed_mid_run_is_retried_and_the_answers_stay(capsys, tmp_path: Path) -> None:
    folder = _late_rows(tmp_path)
    embedded = tmp_path / "embedded.json"
    assert cli.main(["skew", "-q", str(folder), "-o", str(embedded),
                     "--partition-launches", "100000"]) == 0
    capsys.readouterr()
    with _cluster(tmp_path, 2) as made:
        on_dask = tmp_path / "dask.json"
        running, result = _run_in_thread(
            ["skew", "-q", str(folder), "-o", str(on_dask), "--partition-launches", "100000",
             "--engine", "dask", "--scheduler", made.scheduler_address])
        killed = _kill_a_busy_worker(made.scheduler_address, running)
        running.join(timeout=300)
    assert killed and killed["running"], "no task of the run was seen running: none killed"
    assert result["code"] == 0
    assert on_dask.read_bytes() == embedded.read_bytes()


def test_a_run_that_cannot_finish_fails_cleanly_and_writes_nothing(capsys,
                                                                    tmp_path: Path) -> None:
    """Dask allowed no retry, and its one worker killed while it runs a task: the command
    says so, exits 2, and leaves no output, whole or half-written."""
    import dask

    folder = _late_rows(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            _cluster(tmp_path, 1) as made:
        running, result = _run_in_thread(
            ["skew", "-q", str(folder), "-o", str(out / "i.json"),
             "--partition-launches", "100000", "--engine", "dask",
             "--scheduler", made.scheduler_address])
        killed = _kill_a_busy_worker(made.scheduler_address, running)
        running.join(timeout=300)
    assert killed and killed["running"]
    assert result["code"] == cli.BAD_INPUT
    assert "the Dask run failed" in capsys.readouterr().err
    assert list(out.iterdir()) == []


def test_the_command_starts_its_own_local_cluster(jobs, tmp_path: Path) -> None:
    """``python -m autoannot skew --engine dask --workers 1``, as a user types it: the command
    starts a local cluster and stops it, and says what the embedded engine says."""
    import subprocess
    import sys

    from harness import clean_env

    out, _ = jobs["chain"]
    command = [sys.executable, "-m", "autoannot", "skew", "-q", str(out)]
    env = {**clean_env(), "DASK_TEMPORARY_DIRECTORY": str(tmp_path)}
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    here = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    on_dask = subprocess.run([*command, "--engine", "dask", "--workers", "1",
                              "--worker-memory", "1GB"], capture_output=True, text=True,
                             timeout=120, env=env)
    assert here.returncode == on_dask.returncode == 0, on_dask.stderr[-2000:]
    assert on_dask.stdout == here.stdout


def test_a_plan_of_thousands_of_ranks_reaches_the_workers_in_seconds(cluster,
                                                                     tmp_path: Path) -> None:
    """4,096 ranks' rows (a plan of 4,096 sources, each with its own small tables) on the
    Dask cluster: the same figures, in well under a minute (the plan goes as one blob)."""
    folder = _write_rows(tmp_path, 4096, 20)
    heads = [rows.read_head(p)[0] for p in sorted(folder.iterdir())]
    from autoannot.traces.analysis import engines

    here = matching.analyze_rows(heads, target=20_000)
    engine = engines.Dask(cluster.scheduler_address)
    started = time.monotonic()
    try:
        on_dask = matching.analyze_rows(heads, engine=engine, target=20_000)
    finally:
        engine.close()
    took = time.monotonic() - started
    assert on_dask.plan.partitions > 1
    assert on_dask.per_rank() == here.per_rank() and on_dask.origins() == here.origins()
    assert took < 45, f"{took:.0f} s"


def test_launches_placed_by_their_sequence_are_in_the_order_a_sort_gives() -> None:
    """The matcher places launches into instances by arithmetic (a group's base, its seq, the
    rank's position among the group's ranks present) where sequences are dense: the order
    is the sort's, on groups of every shape — ranks missing, seqs skipped, groups of one —
    and a place taken twice (one rank launching one seq twice) is left to the sort."""
    import numpy as np

    from autoannot.traces.analysis import partitions

    rng = np.random.default_rng(7)
    placed_any = 0
    for _ in range(200):
        width, groups = int(rng.integers(1, 24)), int(rng.integers(1, 5))
        rows = []
        for g in range(groups):
            members = rng.choice(width, size=int(rng.integers(1, width + 1)), replace=False)
            low = int(rng.integers(0, 1000))
            for seq in range(low, low + int(rng.integers(1, 30))):
                for column in members:
                    if rng.random() > 0.1:  # (some launches missing)
                        rows.append((g, seq, int(column)))
        if not rows:
            continue
        shuffled = np.array(rows, np.int64)[rng.permutation(len(rows))]
        group = shuffled[:, 0].astype(np.int32)
        seq, column = shuffled[:, 1], shuffled[:, 2].astype(np.int32)
        sorted_order = partitions._sort_by_instance(group, seq, column, width, groups)
        placed = partitions._placed_by_instance(group, seq, column, width, groups)
        if placed is not None:
            placed_any += 1
            assert np.array_equal(placed, sorted_order)
        twice = np.r_[group, group[:1]], np.r_[seq, seq[:1]], np.r_[column, column[:1]]
        assert partitions._placed_by_instance(*twice, width, groups) is None
    assert placed_any > 150


def _write_rank(folder: Path, rank: int, run: str, start: Any, end: Any, size: Any) -> None:
    """Rank ``rank``'s rows of a 3-rank default group's all-reduces, one an instance (seq 0
    on), each a GPU kernel, with these times and sizes."""
    import numpy as np

    instances = len(start)
    columns = {"group": np.zeros(instances, np.uint32), "seq": np.arange(instances),
               "collective": np.zeros(instances, np.uint32), "size_bytes": size,
               "start_us": start, "end_us": end,
               "site": np.zeros(instances, np.int32), "kernel": np.ones(instances, np.uint8),
               "step": np.full(instances, -1, np.int32), "dtype": np.zeros(instances, np.uint32)}
    rows.write(rows.Rows(rank, columns, [{"name": "0", "desc": "default_pg", "size": 3}],
                         ["allreduce"], ["/job/train.py:1"], run=run, dtypes=["Float"]),
               folder / f"rank{rank}.rows")


def test_a_clock_is_fitted_without_the_instances_another_rank_spoils(tmp_path: Path) -> None:
    """A rank's clock is the median of its kernels' ends less the first rank's over the
    instances no rank spoils. Planted: rank 1's ends are rank 0's plus known offsets, one of
    them far out, at the one instance where rank 2 launched another size (which spoils it
    for every rank). On every path — one partition in memory, many partitions whose ranks
    are fitted before every spoilt instance is known — rank 1's clock is the median of the
    others, not of all."""
    import numpy as np

    from autoannot.traces.analysis import engines

    instances, spoilt_at = 41, 20
    rng = np.random.default_rng(3)
    planted = 4.0 + rng.uniform(0.0, 2.0, instances)
    planted[spoilt_at] = 900.0  # (rank 1's end there: far out; the instance is rank 2's odd one)
    expected = float(np.median(np.delete(planted, spoilt_at)))
    assert expected != float(np.median(planted))
    base = 1e6 + 1000.0 * np.arange(instances)
    for rank in range(3):
        end = base + 50.0 + (planted if rank == 1 else 0.0)
        size = np.full(instances, 1 << 20, np.int64)
        if rank == 2:
            size[spoilt_at] = 1 << 10
        _write_rank(tmp_path, rank, "fit", base + (planted if rank == 1 else 0.0), end, size)
    files = sorted(tmp_path.glob("*.rows"))
    for target in (None, 30):  # (one partition in memory; two partitions, pass 1 by rank)
        found = lineup.analyze_files([], [], rows=files, engine=engines.Embedded(1),
                                     target=target)
        assert (target is None) == (found.plan.partitions == 1)
        fit = next(f for f in found.clocks if f.rank == 1)
        assert fit.instances == instances - 1
        assert fit.offset_us == pytest.approx(expected, abs=1e-9)


def test_a_rank_s_launches_either_side_of_a_partition_are_on_its_fitted_clock(
        tmp_path: Path, capsys) -> None:
    """Each launch's previous launch on its rank (where a straggler's delay began) and its
    next one (the bound on a wait known by its entry alone) come, at a partition's edge,
    from the rows either side of the rank's range: on the rank's fitted clock, as the rows
    within. Planted: rank 2's clock 7 ms ahead, rank 1 300 us late at every 5th instance,
    rank 2's end unknown at every 7th, where rank 1 comes 1.5 ms late (after rank 2's next
    entry: rank 2's wait there is bounded by it). Cut into partitions of 6 launches, every
    answer is the answer of one partition, byte for byte; rank 2's clock applied."""
    import numpy as np

    instances = 60
    base = 1e6 + 1000.0 * np.arange(instances)
    for rank in range(3):
        seq = np.arange(instances)
        start = base + 10.0 * rank
        if rank == 1:
            start += np.where(seq % 5 == 2, 300.0, 0.0) + np.where(seq % 7 == 3, 1500.0, 0.0)
        end = base + 400.0
        if rank == 2:
            start, end = start + 7000.0, end + 7000.0
            end[seq % 7 == 3] = np.nan
        _write_rank(tmp_path, rank, "edges", start, end, np.full(instances, 1 << 20, np.int64))
    files = sorted(tmp_path.glob("*.rows"))
    cut = lineup.analyze_files([], [], rows=files, target=6)
    assert cut.plan.partitions >= 10
    assert next(f for f in cut.clocks if f.rank == 2).applied
    whole = _answers(capsys, tmp_path, "whole", str(tmp_path))
    parts = _answers(capsys, tmp_path, "parts", str(tmp_path), "--partition-launches", "6",
                     "-j", "1")
    for name in ("codes", "text", "json", "i.json", "i.csv", "page.html"):
        assert parts[name] == whole[name], name

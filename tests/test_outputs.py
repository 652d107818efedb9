"""Issue 28: the tools never write over a file they did not make, write nothing when they exit
2, and the README's flow works end to end on the folders they write (real committed 2 x H200
traces and ledgers, copied; every input's bytes checked after)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from autoannot import cli
from autoannot.traces import outputs
from autoannot.traces.read import ledger

GRAPHS = Path(__file__).parent / "data" / "gpu" / "graphs"


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """Two ranks' graphed traces and ledgers, and a framework's metrics file beside them."""
    folder = tmp_path / "job"
    folder.mkdir()
    for rank in range(2):
        for ending in (".json", ".autoannot"):
            shutil.copy(GRAPHS / f"graph_rank{rank}{ending}", folder / f"graph_rank{rank}{ending}")
    (folder / "metrics.json").write_text(json.dumps({"loss": [1.0, 0.5], "step": 2}))
    return folder


def test_o_never_writes_over_a_file_autoannot_did_not_write(job: Path, capsys) -> None:
    raw0 = (job / "graph_rank0.json").read_bytes()
    assert cli.main(["annotate", "-q", str(job / "graph_rank1.json"), "-o",
                     str(job / "graph_rank0.json")]) == 2
    assert "autoannot did not write it" in capsys.readouterr().err
    assert (job / "graph_rank0.json").read_bytes() == raw0  # rank 0's raw trace is still there
    # a ledger's name is never an output
    assert cli.main(["annotate", "-q", str(job / "graph_rank0.json"), "-o",
                     str(job / "graph_rank0.autoannot.json")]) == 2
    assert not (job / "graph_rank0.autoannot.json").exists()
    # --force replaces it, and the file is then autoannot's (the next run needs no --force)
    assert cli.main(["annotate", "-q", "--force", str(job / "graph_rank1.json"), "-o",
                     str(job / "out.json")]) == 0
    assert cli.main(["annotate", "-q", str(job / "graph_rank1.json"), "-o",
                     str(job / "out.json")]) == 0


@pytest.mark.parametrize("command", ["summary", "skew"])
def test_row_files_replace_only_their_own(job: Path, command: str, capsys) -> None:
    users = job / "rows.json"
    users.write_text("my own notes\n")
    assert cli.main([command, "-q", str(job), "-o", str(users)]) == 2
    assert users.read_text() == "my own notes\n"
    mine = job / "mine.json"
    assert cli.main([command, "-q", str(job), "-o", str(mine)]) in (0, 1)
    assert outputs.written_by_autoannot(mine) == command
    first = mine.read_bytes()
    assert cli.main([command, "-q", str(job), "-o", str(mine)]) in (0, 1)  # its own: replaced
    assert mine.read_bytes() == first
    mine.write_text("edited by hand\n")  # changed since: no longer autoannot's
    assert cli.main([command, "-q", str(job), "-o", str(mine)]) == 2
    capsys.readouterr()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_nothing_is_written_when_one_output_cannot_be(job: Path, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert cli.main(["summary", "-q", str(job), "-o", str(tmp_path / "ok.csv"), "-o",
                         str(locked / "r.json")]) == 2
    finally:
        locked.chmod(stat.S_IRWXU)
    assert not (tmp_path / "ok.csv").exists()


def test_nothing_is_written_when_an_output_has_no_folder_to_go_in(job: Path,
                                                                   tmp_path: Path) -> None:
    """(As root too: no folder can be made under a file.)"""
    (tmp_path / "a-file").write_text("not a folder\n")
    assert cli.main(["summary", "-q", str(job), "-o", str(tmp_path / "ok.csv"), "-o",
                     str(tmp_path / "a-file" / "r.json")]) == 2
    assert not (tmp_path / "ok.csv").exists()
    assert (tmp_path / "a-file").read_text() == "not a folder\n"


def test_nothing_is_written_when_a_later_output_fails(job: Path, tmp_path: Path,
                                                     monkeypatch) -> None:
    """(Also as root: the second output's write fails after the first was made.)"""
    from autoannot.traces.render import summary

    def broken(rows: list, path: Path) -> None:
        raise OSError(28, "No space left on device", str(path))

    (job / "metrics.json").unlink()  # (only traces: the command gets as far as writing)
    monkeypatch.setattr(summary, "write_csv", broken)
    assert cli.main(["summary", "-q", str(job), "-o", str(tmp_path / "ok.json"), "-o",
                     str(tmp_path / "full.csv")]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]  # no temporary left either
    assert cli.main(["summary", "-q", str(job), "-o", str(tmp_path / "ok.json")]) in (0, 1)
    assert (tmp_path / "ok.json").exists()  # (what failed above was the second output alone)


def test_the_newcomer_flow_twice_on_the_folders_it_writes(job: Path, tmp_path: Path,
                                                          capsys) -> None:
    before = _digests(job)
    out = tmp_path / "out"
    for _ in range(2):
        assert cli.main(["annotate", "-q", str(job), "-o", f"{out}/"]) == 0
        said = capsys.readouterr().err
        assert "skipped" in said and "metrics.json" in said  # named once, not read
        assert cli.main(["summary", "-q", str(out), "-o", str(out / "rows.json"), "-o",
                         str(out / "rows.csv")]) == 0
        assert cli.main(["skew", "-q", str(out), "-o", str(out / "skew.json")]) == 0
        assert cli.main(["check", str(out)]) == 0
        assert "0 diverge" in capsys.readouterr().out
        assert cli.main(["summary", "-q", str(out)]) == 0  # the row files are not traces
        assert cli.main(["plot", str(out), "-o", str(out / "timeline.png")]) == 0
        capsys.readouterr()
    assert _digests(job) == before  # no input changed


def test_check_reads_the_ledgers_beside_the_traces(job: Path, capsys) -> None:
    """Two ranks whose graph captured a 1024- against a 2048-element all-reduce: given the
    traces alone, the ledgers beside them say so."""
    document = json.loads((job / "graph_rank1.autoannot").read_text())
    graph = next(iter(document["graphs"].values()))
    entry = next(e for e in graph if e["annotation"].get("Collective name") == "allreduce")
    entry["annotation"]["In msg nelems"] = entry["annotation"]["In msg nelems"] * 2 + 1
    (job / "graph_rank1.autoannot").write_text(json.dumps(document))
    assert cli.main(["check", str(job / "graph_rank0.json"), str(job / "graph_rank1.json")]) == 1
    assert "DIVERGES" in capsys.readouterr().out


def test_a_ledger_of_an_unknown_version_is_refused_by_name(job: Path, capsys) -> None:
    document = json.loads((job / "graph_rank0.autoannot").read_text())
    document["version"] = 99
    (job / "graph_rank0.autoannot").write_text(json.dumps(document))
    assert cli.main(["annotate", "-q", str(job / "graph_rank0.json"), "-o",
                     str(job / "a.json")]) == 2
    assert "version 99" in capsys.readouterr().err
    with pytest.raises(Exception, match="version 99"):
        ledger.load(job / "graph_rank0.autoannot")


def test_the_summary_table_says_only_what_it_knows(job: Path, tmp_path: Path, capsys) -> None:
    """No "held up by rank 0 (0.00 ms)" (a wait below what the table shows is no hold-up), and
    a long group description is shortened, never the group's name in parentheses."""
    from autoannot.traces.render.summary import _fit

    out = tmp_path / "out"
    assert cli.main(["annotate", "-q", str(job), "-o", f"{out}/"]) == 0
    capsys.readouterr()
    assert cli.main(["summary", "-q", str(out)]) == 0
    table = capsys.readouterr().out
    assert "held up by" in table and "(0.00 ms)" not in table
    fitted = _fit("tensor_parallel_group_of_eight (12)", 22)
    assert len(fitted) == 22 and fitted.endswith("(12)")
    assert _fit("default_pg (0)", 22) == "default_pg (0)"


def test_a_ledger_that_disagrees_on_one_graph_annotates_the_others(job: Path, capsys) -> None:
    """The same process's ledger, one graph's collectives cut short: that graph is left
    unannotated and named, the other annotated, exit 1 (a ledger of another rank or process
    is still refused whole)."""
    document = json.loads((job / "graph_rank0.autoannot").read_text())
    names = sorted(document["graphs"])
    document["graphs"][names[1]] = document["graphs"][names[1]][:-1]
    (job / "graph_rank0.autoannot").write_text(json.dumps(document))
    out = job / "a.json"
    assert cli.main(["annotate", "--json", "-q", str(job / "graph_rank0.json"), "-o",
                     str(out)]) == 1
    captured = capsys.readouterr()
    (report,) = json.loads(captured.out)
    assert f"{names[1]} left unannotated" in captured.err
    assert 0 < report["kernels_annotated"] < report["graphed_nccl_kernels"]
    annotated = json.loads(out.read_text())["traceEvents"]
    assert any(e.get("args", {}).get("Collective name") for e in annotated
               if e.get("cat") == "kernel")
    assert cli.main(["annotate", "-q", str(job / "graph_rank0.json"), "--ledger",
                     str(job / "graph_rank1.autoannot"), "-o", str(job / "b.json")]) == 2
    assert not (job / "b.json").exists()


def test_summary_rows_name_what_they_hold(job: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert cli.main(["annotate", "-q", str(job), "-o", f"{out}/"]) == 0
    capsys.readouterr()
    assert cli.main(["summary", "-q", "--json", str(out)]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows
    for row in rows:  # the median kernel time across ranks lies between the extremes
        assert row["median_us_min"] <= row["median_us_median"] <= row["median_us_max"]
        assert row["total_bytes_per_rank"] == row["size_bytes"] * row["count_max"]
        assert "bytes_per_rank" not in row


def test_smaller_points(job: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    trace = str(job / "graph_rank0.json")
    # check A A is "given twice", as the other commands say
    assert cli.main(["check", trace, trace]) == 2
    assert "given twice" in capsys.readouterr().err
    # plot takes --json and -q, as the docs promise
    pytest.importorskip("matplotlib")
    assert cli.main(["plot", "-q", "--json", trace, "-o", str(tmp_path / "t.png")]) == 0
    assert json.loads(capsys.readouterr().out)["ranks"] == 1
    # a command that fails, or is interrupted, leaves no folder it made
    assert cli.main(["annotate", "-q", str(job / "metrics.json"), "-o",
                     str(tmp_path / "new" / "deep" / "a.json")]) == 2
    assert not (tmp_path / "new").exists()
    from autoannot.traces import parallel

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(parallel, "map_files", interrupted)
    assert cli.main(["annotate", "-q", trace, "-o", str(tmp_path / "gone" / "a.json")]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert not (tmp_path / "gone").exists()


def test_build_native_without_a_compiler_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no c++, g++, clang++ here
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(tmp_path / "native"))
    assert cli.main(["build-native"]) == 1
    assert "no C++ compiler" in capsys.readouterr().err


def test_skew_reads_raw_graphed_traces_through_their_ledgers(job: Path, tmp_path: Path,
                                                            capsys) -> None:
    """As annotate does: the ledger beside each raw trace gives its graphed kernels their
    args, so skew lines up the same instances from the raw traces as from annotate's output."""
    raw = [str(job / "graph_rank0.json"), str(job / "graph_rank1.json")]
    assert cli.main(["skew", "-q", "--json", *raw]) == 0
    from_raw = json.loads(capsys.readouterr().out)
    out = tmp_path / "out"
    assert cli.main(["annotate", "-q", *raw, "-o", f"{out}/"]) == 0
    capsys.readouterr()
    assert cli.main(["skew", "-q", "--json", str(out)]) == 0
    from_annotated = json.loads(capsys.readouterr().out)
    assert len(from_raw["instances"]) == len(from_annotated["instances"]) > 0
    assert ([(i["group"], i["seq"], i["collective"]) for i in from_raw["instances"]]
            == [(i["group"], i["seq"], i["collective"]) for i in from_annotated["instances"]])
    assert not from_raw["problems"]


def test_progress_stays_out_of_logs(job: Path, tmp_path: Path, capsys) -> None:
    """Not a terminal (a log, CI): no progress lines, only what the command has to say."""
    raw = [str(job / "graph_rank0.json"), str(job / "graph_rank1.json")]
    assert cli.main(["annotate", "-j", "1", *raw, "-o", f"{tmp_path / 'out'}/"]) == 0
    said = capsys.readouterr().err
    assert "[1/2]" not in said and "[2/2]" not in said


def _on_a_terminal(args: list[str], after_s: str | None) -> str:
    """What ``autoannot ARGS`` shows on stderr when stderr is a terminal (a pseudo-terminal),
    with ``AUTOANNOT_PROGRESS_AFTER_S`` set to ``after_s`` (unset: None)."""
    import pty
    import subprocess
    import sys
    import threading

    from harness import clean_env

    env = clean_env()
    env.pop("AUTOANNOT_PROGRESS_AFTER_S", None)
    if after_s is not None:
        env["AUTOANNOT_PROGRESS_AFTER_S"] = after_s
    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # the terminal's other end closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        done = subprocess.run([sys.executable, "-m", "autoannot", *args], env=env,
                              stdout=subprocess.DEVNULL, stderr=slave, timeout=300)
    finally:
        os.close(slave)
        reader.join(timeout=30)
        os.close(master)
    assert done.returncode == 0
    return b"".join(chunks).decode(errors="replace")


def test_progress_shows_on_a_terminal_only_after_its_delay(job: Path, tmp_path: Path) -> None:
    """On a terminal: ``[n/N]`` over a batch and a bar while a trace is read, once the work has
    run past the delay (0 s here); under the default 2 s, this short work shows none; ``-q``
    none at all."""
    raw = [str(job / "graph_rank0.json"), str(job / "graph_rank1.json")]
    shown = _on_a_terminal(["annotate", "-j", "1", *raw, "-o", f"{tmp_path / 'a'}/"], "0")
    assert "[1/2]" in shown and "[2/2]" in shown
    assert "graph_rank0.json" in shown and "[#" in shown  # the reading bar
    assert "\x1b[K" in shown  # rewritten in place
    short = _on_a_terminal(["annotate", "-j", "1", *raw, "-o", f"{tmp_path / 'b'}/"], None)
    assert "[1/2]" not in short and "[#" not in short
    quiet = _on_a_terminal(["annotate", "-q", "-j", "1", *raw, "-o", f"{tmp_path / 'c'}/"], "0")
    assert "[1/2]" not in quiet and "[#" not in quiet


def test_a_progress_delay_that_is_no_number_is_refused(job: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("AUTOANNOT_PROGRESS_AFTER_S", "soon")
    assert cli.main(["summary", str(job)]) == 2
    assert "AUTOANNOT_PROGRESS_AFTER_S='soon'" in capsys.readouterr().err

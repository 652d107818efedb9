"""The trace tools as a user meets them: every subcommand on every kind of input a user has
(eager NCCL, gloo, graphed with and without its ledger, folders, .gz, a wrong ledger, two traces
of one rank, the tools' own outputs): the exit code, the message, and no input ever changed.
Then one test per way the tools used to lose, mix up or invent data (issue 18)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from cpu_traces import gloo_traces
from harness import clean_env

from autoannot import cli
from autoannot.traces import files, outputs

DATA = Path(__file__).parent / "data" / "gpu"
GRAPHS = DATA / "graphs"
ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return gloo_traces(tmp_path_factory.mktemp("gloo"))


@pytest.fixture
def inputs(tmp_path: Path, gloo: list[Path]) -> dict[str, Path]:
    """One folder of every kind of input, copied (the committed data is never touched)."""
    into = tmp_path / "in"
    into.mkdir()
    for name in ("eager_rank0.json", "eager_rank1.json", "graph_rank0.json",
                 "graph_rank0.autoannot", "graph_rank1.json", "graph_rank1.autoannot",
                 "inline_rank0.json"):
        shutil.copy(GRAPHS / name, into / name)
    for path in gloo:
        shutil.copy(path, into / path.name)
    (into / "job").mkdir()  # what a profiler handler writes: a folder of rank traces
    for r in range(2):
        for ending in (".json", ".autoannot"):
            shutil.copy(GRAPHS / f"graph_rank{r}{ending}", into / "job" / f"host_{r}{ending}")
    (into / "noledger").mkdir()
    shutil.copy(GRAPHS / "graph_rank0.json", into / "noledger" / "graph_rank0.json")
    (into / "gz").mkdir()
    with gzip.open(into / "gz" / "graph_rank0.json.gz", "wt") as f:
        f.write((GRAPHS / "graph_rank0.json").read_text())
    shutil.copy(GRAPHS / "graph_rank0.autoannot", into / "gz" / "graph_rank0.autoannot")
    (into / "dup").mkdir()
    for ending in (".json", ".autoannot"):
        shutil.copy(GRAPHS / f"graph_rank0{ending}", into / "dup" / f"graph_rank0{ending}")
    (into / "foreign").mkdir()
    shutil.copy(DATA / "patterns" / "ddp" / "graph_rank0.autoannot",
                into / "foreign" / "ddp.autoannot")
    (into / "outputs").mkdir()
    assert cli.main(["annotate", str(into / "graph_rank0.json"), "-q",
                     "-o", str(into / "outputs" / "graph_rank0.json")]) == 0
    return {"dir": into}


def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


IN = "{in}"  # the inputs folder, in the table below
#: (subcommand and arguments, exit code, words the message must hold)
CASES = [
    (["annotate", f"{IN}/eager_rank0.json"], 1, ["eager", "autoannot summary"]),
    (["annotate", f"{IN}/gloo_rank0.json"], 1, ["gloo", "autoannot summary"]),
    (["annotate", f"{IN}/graph_rank0.json", "-o", "{out}/a.json"], 0, ["36/36"]),
    (["annotate", f"{IN}/noledger/graph_rank0.json", "-o", "{out}/"], 2,
     ["no ledger", "AUTOANNOT=1", "--ledger"]),
    (["annotate", f"{IN}/job", "-o", "{out}/"], 0, ["host_0.json", "host_1.json", "36/36"]),
    (["annotate", f"{IN}/gz/graph_rank0.json.gz", "-o", "{out}/"], 0, ["36/36"]),
    (["annotate", f"{IN}/graph_rank0.json", "--ledger", f"{IN}/foreign/ddp.autoannot",
      "-o", "{out}/x.json"], 2, ["does not belong", "process 831", "--force"]),
    (["annotate", f"{IN}/graph_rank0.json", f"{IN}/dup/graph_rank0.json", "-o", "{out}/"], 0,
     ["out/graph_rank0.json", "out/dup/graph_rank0.json"]),
    (["annotate", f"{IN}/inline_rank0.json"], 1, ["already", "in the job"]),
    (["annotate", f"{IN}/outputs/graph_rank0.json", "-o", "{out}/"], 2,
     ["already", "raw trace"]),
    (["summary", f"{IN}/eager_rank0.json", f"{IN}/eager_rank1.json"], 0, ["busbw"]),
    (["summary", f"{IN}/gloo_rank0.json", f"{IN}/gloo_rank1.json"], 0,
     ["gloo", "all_reduce", "AUTOANNOT_RECORD"]),
    (["summary", f"{IN}/graph_rank0.json"], 1, ["no collective args", "autoannot annotate"]),
    (["summary", f"{IN}/noledger"], 1, ["autoannot annotate"]),
    (["summary", f"{IN}/job"], 1, ["autoannot annotate"]),
    (["summary", f"{IN}/gz/graph_rank0.json.gz"], 1, ["autoannot annotate"]),
    (["summary", f"{IN}/graph_rank0.json", f"{IN}/inline_rank0.json"], 2, ["both rank 0"]),
    (["summary", f"{IN}/graph_rank0.json", f"{IN}/outputs/graph_rank0.json"], 2,
     ["annotated copy"]),
    (["summary", f"{IN}/outputs/graph_rank0.json", "-o", "{out}/rows.csv"], 0, ["allreduce"]),
    (["plot", f"{IN}/eager_rank0.json", f"{IN}/eager_rank1.json", "-o", "{out}/t.png"], 0,
     ["2 ranks"]),
    (["plot", f"{IN}/gloo_rank0.json", "-o", "{out}/t.png"], 1, ["gloo", "autoannot summary"]),
    (["plot", f"{IN}/job", "-o", "{out}/t.png"], 0, ["2 ranks"]),
    (["plot", f"{IN}/gz/graph_rank0.json.gz", "-o", "{out}/t.svg"], 0, ["1 ranks"]),
    (["plot", f"{IN}/graph_rank0.json", f"{IN}/inline_rank0.json", "-o", "{out}/t.png"], 2,
     ["both rank 0"]),
    (["plot", f"{IN}/outputs/graph_rank0.json", "-o", "{out}/t.png"], 0, ["1 ranks"]),
]


@pytest.mark.parametrize(("argv", "code", "words"), CASES,
                         ids=[" ".join(c[0][:2]).replace(IN, "") for c in CASES])
def test_every_subcommand_on_every_kind_of_input(argv: list[str], code: int, words: list[str],
                                                 inputs: dict[str, Path], tmp_path: Path,
                                                 capfd) -> None:
    pytest.importorskip("matplotlib")
    folder = inputs["dir"]
    before = hashes(folder)
    out = tmp_path / "out"
    argv = [a.replace(IN, str(folder)).replace("{out}", str(out)) for a in argv]
    assert cli.main(argv) == code
    said = capfd.readouterr()
    text = said.out + said.err
    for word in words:
        assert word in text, text
    assert hashes(folder) == before  # no input changed, nothing added among them
    if code == 2:
        assert not out.exists() or not any(out.rglob("*.json"))  # nothing written


# --- one test per point of issue 18 --------------------------------------------------------

def test_1_no_option_writes_over_an_input(inputs: dict[str, Path], capsys) -> None:
    folder = inputs["dir"]
    r0, r1 = str(folder / "eager_rank0.json"), str(folder / "eager_rank1.json")
    before = hashes(folder)
    with pytest.raises(SystemExit) as exc:  # --json is a switch everywhere: r0 is extra
        cli.main(["summary", r0, r1, "--json", r0])
    assert exc.value.code == 2
    assert cli.main(["summary", r0, r1, "-o", r0]) == 2
    assert "is an input" in capsys.readouterr().err
    assert hashes(folder) == before
    assert cli.main(["summary", r0, r1, "-q", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"]


def test_2_one_output_per_rank_in_the_common_layout(tmp_path: Path) -> None:
    for r in range(2):
        (tmp_path / f"n{r}").mkdir()
        shutil.copy(GRAPHS / f"graph_rank{r}.json", tmp_path / f"n{r}" / "trace.json")
        shutil.copy(GRAPHS / f"graph_rank{r}.autoannot", tmp_path / f"n{r}" / "trace.autoannot")
    os.chdir(tmp_path)
    assert cli.main(["annotate", "n0/trace.json", "n1/trace.json", "-o", "coll/", "-q"]) == 0
    for r in range(2):
        doc = json.loads((tmp_path / "coll" / f"n{r}" / "trace.json").read_text())
        assert doc["distributedInfo"]["rank"] == r  # rank r's own result, not overwritten
        assert doc[files.MARKER]["from"] == "trace.json"


def test_3_a_ledger_is_checked_against_its_trace(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "graph_rank0.json"
    shutil.copy(GRAPHS / "graph_rank0.json", trace)
    foreign = DATA / "patterns" / "graphed" / "graph_rank0.autoannot"
    assert cli.main(["annotate", str(trace), "--ledger", str(foreign), "-o",
                     str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "process 980" in err and "process 1824" in err
    assert not (tmp_path / "o.json").exists()
    # --force uses it; every graphed kernel it cannot annotate is reported; exit 1
    assert cli.main(["annotate", str(trace), "--ledger", str(foreign), "--force", "-o",
                     str(tmp_path / "o.json")]) == 1
    out = capsys.readouterr().out
    assert "of the trace's 36 graphed NCCL kernels left unannotated" in out
    # the replays ran with the agent off (no replay ranges): nothing matched is exit 1
    doc = json.loads(trace.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if not str(e.get("name", "")).startswith("autoannot.replay:")]
    trace.write_text(json.dumps(doc))
    shutil.copy(GRAPHS / "graph_rank0.autoannot", tmp_path / "graph_rank0.autoannot")
    assert cli.main(["annotate", str(trace), "-o", str(tmp_path / "p.json")]) == 1
    said = capsys.readouterr()
    assert "0/0" in said.out and "outside any autoannot replay range" in said.err


def test_4_two_traces_of_one_rank_are_refused_and_outputs_stay_apart(
        inputs: dict[str, Path], capsys) -> None:
    folder = inputs["dir"]
    trace = str(folder / "eager_rank0.json")
    assert cli.main(["summary", trace, str(folder / "graph_rank0.json")]) == 2
    assert "both rank 0" in capsys.readouterr().err
    job = folder / "job"
    top_level = sorted(p.name for p in job.iterdir())
    assert cli.main(["annotate", str(job), "-q"]) == 0
    assert sorted(p.name for p in job.iterdir()) == sorted([*top_level, "annotated"])
    assert sorted(p.name for p in job.glob("*.json")) == ["host_0.json", "host_1.json"]
    capsys.readouterr()
    assert cli.main(["summary", str(job / "annotated"), "-q", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert sum(r["count_max"] * r["ranks"] for r in rows) == 72  # each kernel once


def test_5_reruns_and_bad_traces_in_a_batch(tmp_path: Path, capsys) -> None:
    for name in ("graph_rank0.json", "graph_rank0.autoannot", "graph_rank1.json",
                 "graph_rank1.autoannot"):
        shutil.copy(GRAPHS / name, tmp_path / name)
    traces = [str(tmp_path / "graph_rank0.json"), str(tmp_path / "graph_rank1.json")]
    assert cli.main(["annotate", *traces]) == 0
    assert cli.main(["annotate", *traces]) == 0  # again: its outputs are not its inputs
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    capsys.readouterr()
    assert cli.main(["annotate", traces[0], str(bad), traces[1], "-o", str(tmp_path / "o"),
                     "-j", "2"]) == 2
    said = capsys.readouterr()
    # (the failed trace named in its message; no progress lines: stderr is not a terminal)
    assert f"{bad}: not valid JSON" in said.err and "[1/3]" not in said.err
    assert said.out.count("36/36") == 2  # the batch went on; both outputs reported
    assert (tmp_path / "o" / "graph_rank1.json").exists()


def test_6_messages_name_the_real_problem(tmp_path: Path, capsys) -> None:
    shutil.copy(GRAPHS / "graph_rank0.autoannot", tmp_path / "cut.autoannot")
    text = (GRAPHS / "graph_rank0.json").read_text()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    (tmp_path / "empty.json").write_text("")
    for name, word in (("cut.json", "truncated"), ("empty.json", "not valid JSON")):
        assert cli.main(["annotate", str(tmp_path / name), "-o", str(tmp_path / "x/")]) == 2
        err = capsys.readouterr().err
        assert word in err and "ledger" not in err, err
    assert cli.main(["annotate", str(GRAPHS / "graph_rank0.json"), "--ledger", "nope"]) == 2
    assert "nope: no such ledger file" in capsys.readouterr().err
    (tmp_path / "none").mkdir()
    assert cli.main(["summary", str(tmp_path / "none")]) == 2
    assert "no trace in it" in capsys.readouterr().err
    blocked = Path("/proc/rows.json")  # a folder where no file can be made, even by root
    assert cli.main(["summary", str(GRAPHS / "eager_rank0.json"), "-q", "-o", str(blocked)]) == 2
    err = capsys.readouterr().err
    assert "/proc/rows.json" in err and ".autoannot-" not in err


def test_7_options_and_environment(tmp_path: Path, capsys) -> None:
    traces = [str(GRAPHS / "graph_rank0.json"), str(GRAPHS / "graph_rank1.json")]
    assert cli.main(["annotate", *traces, "-o", str(tmp_path / "combined.json")]) == 2
    assert "give a folder" in capsys.readouterr().err
    assert not (tmp_path / "combined.json").exists()
    assert cli.main(["annotate", *traces, "-o", str(tmp_path / "both/"), "--format", "pftrace",
                     "-q"]) == 0
    assert sorted(p.name for p in (tmp_path / "both").iterdir()) == [
        outputs.SIDECAR, "graph_rank0.pftrace", "graph_rank1.pftrace"]  # (what wrote them)
    deep = tmp_path / "new" / "deeper"  # missing folders are made for every output
    assert cli.main(["annotate", traces[0], "-o", str(deep / "a.json.gz")]) == 0
    assert cli.main(["summary", str(GRAPHS / "eager_rank0.json"), "-q", "-o",
                     str(deep / "s.csv")]) == 0
    pytest.importorskip("matplotlib")
    assert cli.main(["plot", str(GRAPHS / "eager_rank0.json"), "-o", str(deep / "t.png")]) == 0
    assert {p.name for p in deep.iterdir()} == {"a.json.gz", "s.csv", "t.png", outputs.SIDECAR}


def test_7_run_takes_a_double_dash() -> None:
    done = subprocess.run([sys.executable, "-m", "autoannot", "run", "--", sys.executable, "-c",
                           "import os; print(os.environ['AUTOANNOT'])"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr


@pytest.mark.parametrize(("value", "on"), [("1", True), ("yes", True), (" On ", True),
                                           ("0", False), ("off", False), ("maybe", False),
                                           ("2", False)])
def test_7_agent_switch_is_parsed_strictly(value: str, on: bool) -> None:
    env = clean_env()
    env["AUTOANNOT"] = value
    done = subprocess.run([sys.executable, "-c", "import autoannot; print(autoannot.is_enabled())"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == str(on)
    if value.strip().lower() in ("maybe", "2"):
        assert f"AUTOANNOT={value!r} is not one of" in done.stderr
    else:
        assert done.stderr == ""


def test_7_record_without_the_agent_says_so_once() -> None:
    import autoannot

    assert not autoannot.is_enabled()
    from autoannot.base import diagnostics

    diagnostics._said.discard("record:off")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with autoannot.record():
            pass
        with autoannot.record():
            pass
    messages = [str(w.message) for w in said if w.category is autoannot.AutoannotWarning]
    assert len(messages) == 1 and "agent off" in messages[0]
    assert said[0].filename == __file__  # pointed at the user's line


def test_8_install_script_says_where_torch_comes_from(tmp_path: Path) -> None:
    no_torch = tmp_path / "python"  # an interpreter where torch does not import
    no_torch.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    no_torch.chmod(0o755)
    env = {**os.environ, "PYTHON": str(no_torch)}
    env.pop("TORCH_INDEX_URL", None)

    def dry(*args: str, **extra: str) -> list[str]:
        done = subprocess.run(["sh", str(ROOT / "install.sh"), "--dry-run", *args],
                              env={**env, **extra}, capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    lines = dry()
    assert any("CUDA build" in line for line in lines)  # says what PyPI gives on Linux
    commands = [line for line in lines if line.startswith("+ ")]
    assert commands[0].endswith("pip install torch==2.13.0")
    assert commands[1].endswith("pip install -e .[test]")
    cpu = [line for line in dry("--agent", TORCH_INDEX_URL="https://example.invalid/cpu")
           if line.startswith("+ ")]
    assert cpu[0].endswith("torch==2.13.0 --index-url https://example.invalid/cpu")
    assert cpu[1:] == [f"+ {no_torch} -m pip install -e ."]  # the agent alone
    with_torch = subprocess.run(["sh", str(ROOT / "install.sh"), "--dry-run", "--agent"],
                                env={**env, "PYTHON": sys.executable}, capture_output=True,
                                text=True, cwd=ROOT)
    assert "torch==" not in with_torch.stdout  # an installed torch is never replaced
    bad = subprocess.run(["sh", str(ROOT / "install.sh"), "--nope"], capture_output=True,
                         text=True, cwd=ROOT)
    assert bad.returncode == 2 and "unknown option" in bad.stderr

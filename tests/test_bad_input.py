"""Bad input to the tools: a one-line error naming the file and the problem, exit code 2, and
never a half-written or overwritten output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autoannot import cli

DATA = Path(__file__).parent / "data" / "gpu" / "graphs"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for name in ("graph_rank0.json", "graph_rank0.autoannot", "graph_rank1.json",
                 "graph_rank1.autoannot"):
        shutil.copy(DATA / name, tmp_path / name)
    return tmp_path


def fails(argv: list[str], capsys, *words: str) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for word in words:
        assert word in err, err
    return err


def test_truncated_malformed_and_empty_traces(folder: Path, capsys) -> None:
    text = (folder / "graph_rank0.json").read_text()
    out = folder / "out.json"
    out.write_text("keep me")
    cases = {"truncated": text[: len(text) // 2], "empty": "", "malformed": "{not json",
             "not-a-trace": json.dumps({"hello": 1}), "list": "[1, 2]"}
    for name, content in cases.items():
        bad = folder / f"{name}.json"
        bad.write_text(content)
        shutil.copy(folder / "graph_rank0.autoannot", folder / f"{name}.autoannot")
        fails(["annotate", str(bad), "-o", str(out), "--force"], capsys, str(bad))
        assert out.read_text() == "keep me"  # never overwritten by a failed run
    assert not list(folder.glob(".autoannot-*"))  # no temporary file left behind


def test_ledgers_that_do_not_belong(folder: Path, capsys) -> None:
    trace = str(folder / "graph_rank0.json")
    fails(["annotate", trace, "--ledger", str(folder / "graph_rank1.autoannot"), "-o",
           str(folder / "o.json")], capsys, "rank 1", "rank 0")
    (folder / "junk.json").write_text('{"graphs": {}}')
    fails(["annotate", trace, "--ledger", str(folder / "junk.json")], capsys,
          "not an autoannot ledger")
    (folder / "graph_rank0.autoannot").unlink()
    fails(["annotate", trace], capsys, "no ledger", "graph_rank0.autoannot ")
    fails(["annotate", str(folder / "nope.json")], capsys, "nope.json", "no such file")


def test_unknown_formats_and_unwritable_outputs(folder: Path, capsys) -> None:
    trace = str(folder / "graph_rank0.json")
    fails(["annotate", trace, "-o", str(folder / "out.txt")], capsys, "unknown output format")
    blocker = folder / "a_file"
    blocker.write_text("x")
    fails(["annotate", trace, "-o", str(blocker / "out.json")], capsys, "cannot create",
          str(blocker))
    fails(["annotate", trace, str(folder / "graph_rank1.json"), "-o", str(blocker)], capsys,
          "cannot create")
    fails(["summary", str(folder / "missing.json")], capsys, "missing.json")
    fails(["plot", trace, "-o", str(folder / "x.gif")], capsys, "x.gif")
    with pytest.raises(SystemExit) as exc:
        cli.main(["annotate"])  # argparse: usage error
    assert exc.value.code == 2


@pytest.mark.parametrize("command", ["skew", "summary", "check", "report"])
def test_a_bad_record_line_is_named_by_every_tool(tmp_path: Path, capsys, command: str) -> None:
    """Every tool reads record files through one reader: a line that is no record line is
    refused with its file and line number, the same way."""
    good = {"rank": 0, "pid": 1, "run": "r", "monotonic_ns": 1000, "wall_ns": 2000,
            "group": "0", "seq": 0, "api": "all_reduce", "call_site": "t.py:1",
            "annotation": {"Collective name": "allreduce", "In msg nelems": 4,
                           "Out msg nelems": 4, "Group size": 2, "dtype": "Float",
                           "Process Group Name": "0"}, "param_comms": {}}
    other = {**good, "rank": 1}
    (tmp_path / "rank1.jsonl").write_text(json.dumps(other) + "\n")
    for bad, why in (("{not json", "Expecting"), (json.dumps({"rank": 0}), "annotation"),
                     (json.dumps({**good, "annotation": [1]}), "no annotation object")):
        path = tmp_path / "rank0.jsonl"
        path.write_text(json.dumps(good) + "\n\n" + bad + "\n")
        argv = [command, str(path), str(tmp_path / "rank1.jsonl")]
        if command == "report":
            argv += ["-o", str(tmp_path / "r.html")]
        fails(argv, capsys, f"{path}:3: not a line of an AUTOANNOT_RECORD file", why)
        assert not (tmp_path / "r.html").exists()
    # skew also needs each line's place in its group's sequence, and says why
    path.write_text(json.dumps({k: v for k, v in good.items() if k != "seq"}) + "\n")
    if command == "skew":
        fails([command, str(path), str(tmp_path / "rank1.jsonl")], capsys, ":1:", "'seq'",
              "cannot be lined up across ranks")

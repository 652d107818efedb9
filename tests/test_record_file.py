"""``AUTOANNOT_RECORD``'s file: one JSON line per record, the same as the in-memory recorder's,
written out within ``FileSink.FLUSH_EVERY_S`` and at close."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

import autoannot
from autoannot.recorder import FileSink
from autoannot.state import STATE


def _calls() -> None:
    for _ in range(3):  # the same launch thrice: its JSON reused
        dist.all_reduce(torch.ones(4))
    dist.all_gather_into_tensor(torch.empty(8, dtype=torch.complex64),
                                torch.ones(4, dtype=torch.complex64))
    dist.all_reduce(torch.ones(4))  # after another launch: still its own line


def test_lines_are_the_records_as_json(fake_world, agent, tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path / "rank{rank}" / "records.jsonl"))
    STATE.open_recorder(sink)
    try:
        with autoannot.record() as records:
            _calls()
    finally:
        STATE.close_recorder(sink)
        sink.close()
    lines = (tmp_path / "rank0" / "records.jsonl").read_text().splitlines()
    expected = [json.dumps({"api": r.api, "call_site": r.call_site, "annotation": r.annotation,
                            "param_comms": r.param_comms}) for r in records]
    assert len(records) == 5
    assert lines == expected
    assert json.loads(lines[3])["annotation"]["dtype"] == "Float"  # complex counted as real


def test_lines_are_written_out_while_the_job_runs(fake_world, agent, tmp_path: Path,
                                                  monkeypatch) -> None:
    monkeypatch.setattr(FileSink, "FLUSH_EVERY_S", 0.0)  # every record due at once
    sink = FileSink(str(tmp_path / "records.jsonl"))
    STATE.open_recorder(sink)
    try:
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(4))
        written = (tmp_path / "records.jsonl").read_text().splitlines()  # before close
    finally:
        STATE.close_recorder(sink)
        sink.close()
    assert [json.loads(line)["api"] for line in written] == ["all_reduce", "all_reduce"]

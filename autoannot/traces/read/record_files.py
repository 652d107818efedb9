"""Reading ``AUTOANNOT_RECORD`` files (``journal.py`` writes them): one reader for every tool, so
each takes the same lines and refuses a bad one with the same message."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoannot import vocabulary as V
from autoannot.traces import files
from autoannot.traces.read.runs import run_of


@dataclass
class RecordFile:
    """One process's record file: its rank and host (the last its lines name; None where none
    does), and its lines in order."""

    path: Path
    rank: int | None = None
    host: str | None = None
    lines: list[dict[str, Any]] = field(default_factory=list)
    #: The number of a last line cut short (a job killed while writing it), left out.
    cut: int | None = None

    def runs(self) -> dict[str, list[dict[str, Any]]]:
        """Its lines per run of the job, in order."""
        found: dict[str, list[dict[str, Any]]] = {}
        for line in self.lines:
            found.setdefault(run_of(line), []).append(line)
        return found


def read(path: Path, require: tuple[str, ...] = (), why: str = "") -> RecordFile:
    """A record file; TraceError naming the file and line where a line is no record line (no
    JSON object with an ``annotation`` object, or without a field of ``require``: ``why`` says
    what needs it). A last line with no end (a job killed while writing it) is left out and
    its number kept in ``cut``."""
    record = RecordFile(Path(path))
    whole = files.read_text(Path(path))
    lines = whole.splitlines()
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        if number == len(lines) and not whole.endswith("\n"):
            try:
                json.loads(text)
            except ValueError:
                record.cut = number
                break
        try:
            entry = json.loads(text)
            if not isinstance(entry, dict) or not isinstance(entry["annotation"], dict):
                raise TypeError("no annotation object")
            for name in require:
                if name not in entry:
                    raise KeyError(name)
        except (ValueError, KeyError, TypeError) as exc:
            raise files.TraceError(f"{path}:{number}: not a line of an AUTOANNOT_RECORD file "
                                   f"({exc}){'; ' + why if why else ''}") from None
        if entry.get("rank") is not None:
            record.rank = int(entry["rank"])
        if isinstance(entry.get("host"), str):
            record.host = entry["host"]
        record.lines.append(entry)
    return record


def is_collective(line: dict[str, Any]) -> bool:
    """Whether a line is a collective's (not a point-to-point block's)."""
    return V.COLLECTIVE_NAME in line["annotation"]


def size_of(annotation: dict[str, Any]) -> tuple[str, int, int]:
    """(dtype, elements, bytes) of a launch: the larger of its in and out messages."""
    from autoannot.traces.units import DTYPE_BYTES

    dtype = str(annotation.get(V.DTYPE, "?"))
    nelems = max(int(annotation.get(V.IN_NELEMS, 0)), int(annotation.get(V.OUT_NELEMS, 0)))
    return dtype, nelems, nelems * DTYPE_BYTES.get(dtype, 0)

"""Reading ``AUTOANNOT_RECORD`` files (``journal.py`` writes them): one reader for every tool, so
each takes the same lines and refuses a bad one with the same message.

A file normally holds one process's lines. One that holds several ranks' (every rank appended
to one path, or ``cat rank*.jsonl > all.jsonl``) is read rank by rank (``by_rank``): each
rank's lines are that rank's record, as if it had its own file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoannot.describe import vocabulary as V
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

    def by_rank(self) -> list[RecordFile]:
        """Its lines rank by rank, each rank's as a record of its own (in the order the ranks
        first appear). A line that names no rank (written before the process group was up)
        goes with the rank its process's other lines name; where none does, with the file's
        only rank, if it has one."""
        named = {(run_of(line), line.get("pid")): line["rank"] for line in self.lines
                 if isinstance(line.get("rank"), int)}
        ranks = set(named.values())
        only = next(iter(ranks)) if len(ranks) == 1 else None
        parts: dict[int | None, RecordFile] = {}
        for line in self.lines:
            rank = line.get("rank")
            if not isinstance(rank, int):
                rank = named.get((run_of(line), line.get("pid")), only)
            part = parts.get(rank)
            if part is None:
                part = parts[rank] = RecordFile(self.path, rank,
                                                cut=self.cut if not parts else None)
            if isinstance(line.get("host"), str):
                part.host = line["host"]
            part.lines.append(line)
        return list(parts.values()) or [self]

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


def runs_in(records: list[Path], rows: list[Path]) -> dict[str, list[Path]]:
    """The runs that record files and rows files hold (run -> the files that hold it): what
    ``runs.choose`` takes, for every command alike."""
    from autoannot.traces.read.runs import NO_RUN
    from autoannot.traces.table import rows as table

    found: dict[str, list[Path]] = {}
    for path in records:
        for name in read(path).runs():
            found.setdefault(name, []).append(path)
    for path in rows:
        if table.is_rows_name(path):  # (torch's Flight Recorder dumps name no run)
            found.setdefault(table.read_head(path)[0].run or NO_RUN, []).append(path)
    return found

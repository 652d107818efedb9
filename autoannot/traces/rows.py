"""Rows: one rank's collectives as a compact columnar file, written in the job where the rank
already writes its ledger (at trace export), read by every cross-rank tool as readily as traces.

One row per collective instance the rank took part in: its group, its position in the group's
sequence, the collective, its size, the start and end of its kernel or CPU range (or the
launch's entry time where only the record file knew it), whether a GPU kernel timed it, and the
call site. The file is a text head and binary columns::

    AUTOANNOT-ROWS 1\\n
    {"rank": 3, "run": ..., "host": ..., "count": N, "columns": [["group", "I"], ...], ...}\\n
    <column 1: N values, little-endian> <column 2> ...

Why this layout: the cross-rank questions are asked of thousands of ranks at once, and a JSON
line per launch (a record file's ~600 bytes) takes microseconds to parse each — 16 million of
them is minutes. Binary columns of fixed width read at the disk's speed into arrays (no object
per row) and are 45 bytes an instance; strings (groups, collectives, call sites) are stored
once each in the head. Writing needs only the standard library (``array``), so the job never
imports more than it does today; reading at scale uses numpy.
"""

from __future__ import annotations

import json
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoannot.traces import files
from autoannot.traces.launch import Launch

MAGIC = b"AUTOANNOT-ROWS 1\n"
#: 2 added the "step" column and each group's "ranks"; files of version 1 read with step -1.
VERSION = 2
READABLE = (1, 2)
#: A rows file beside ``NAME.json``: ``NAME.rows`` (as the ledger is ``NAME.autoannot``).
SUFFIX = ".rows"

#: (column, array typecode): the order and width of the columns in the file.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("group", "I"),  # index into the head's "groups"
    ("seq", "q"),  # position in the group's sequence on this rank
    ("collective", "I"),  # index into "collectives"
    ("size_bytes", "q"),
    ("start_us", "d"),  # in the head's time base ("base_ns"; see "clock")
    ("end_us", "d"),  # NaN where only the entry is known
    ("site", "i"),  # index into "sites"; -1: none
    ("kernel", "B"),  # 1: timed by a GPU kernel (ends within microseconds on every rank)
    ("step", "i"),  # the profiler step it ran in (ProfilerStep#N); -1: none known
)


def rows_path(trace_path: str | Path) -> Path:
    """Where the rows of the trace ``trace_path`` go: beside it, ``NAME.rows``."""
    from autoannot.traces import ledger

    return Path(ledger.ledger_path(str(trace_path))).with_suffix(SUFFIX)


def is_rows(path: Path) -> bool:
    """Whether ``path`` is a rows file (a regular file only: a FIFO is never opened)."""
    if not Path(path).is_file():
        return False
    try:
        with open(path, "rb") as handle:
            return handle.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


@dataclass
class Rows:
    """One rank's rows: the head's facts and the columns (``array``s, or numpy arrays where
    read with numpy)."""

    rank: int
    columns: dict[str, Any]
    groups: list[dict[str, Any]]  # {"name", "desc", "size", "ranks" (where known)}
    collectives: list[str]
    sites: list[str]
    run: str | None = None
    host: str | None = None
    clock: str = "trace"  # "trace": the trace's own time base; "wall": entry times
    base_ns: int | None = None  # the wall-clock time of the time base's zero, where known
    source: str = ""  # what they were made from
    extra: dict[str, Any] = field(default_factory=dict)
    #: Where they were read from, and how many rows the head says (``read_head``: the columns
    #: are read later, one file at a time).
    path: Path | None = None
    count: int = 0

    def __len__(self) -> int:
        return len(self.columns["seq"]) if self.columns else self.count


def from_launches(launches: list[Launch], rank: int, **head: Any) -> Rows:
    """Rows of ``launches`` (``launch.Launch``) of one rank."""
    groups: dict[str, int] = {}
    group_facts: list[dict[str, Any]] = []
    collectives: dict[str, int] = {}
    sites: dict[str, int] = {}
    columns = {name: array(code) for name, code in COLUMNS}
    nan = float("nan")
    for launch in launches:
        g = groups.get(launch.group)
        if g is None:
            g = groups[launch.group] = len(group_facts)
            group_facts.append({"name": launch.group, "desc": launch.group_desc,
                                "size": launch.group_size})
            if launch.group_ranks is not None:
                group_facts[-1]["ranks"] = list(launch.group_ranks)
        columns["group"].append(g)
        columns["seq"].append(launch.seq)
        columns["collective"].append(collectives.setdefault(launch.collective, len(collectives)))
        columns["size_bytes"].append(launch.size_bytes)
        columns["start_us"].append(launch.start_us)
        columns["end_us"].append(nan if launch.end_us is None else launch.end_us)
        columns["site"].append(-1 if launch.call_site is None
                               else sites.setdefault(launch.call_site, len(sites)))
        columns["kernel"].append(1 if launch.kernel else 0)
        columns["step"].append(launch.step)
    return Rows(rank, columns, group_facts, list(collectives), list(sites), **head)


def encode(rows: Rows) -> bytes:
    head = {"version": VERSION, "rank": rows.rank, "run": rows.run, "host": rows.host,
            "clock": rows.clock, "base_ns": rows.base_ns, "source": rows.source,
            "count": len(rows), "byteorder": "little", "columns": [list(c) for c in COLUMNS],
            "groups": rows.groups, "collectives": rows.collectives, "sites": rows.sites,
            **rows.extra}
    parts = [MAGIC, json.dumps(head, separators=(",", ":")).encode(), b"\n"]
    for name, code in COLUMNS:
        column = rows.columns[name]
        if isinstance(column, array):
            if column.typecode != code:
                column = array(code, column)
            if sys.byteorder != "little":
                column = array(code, column)
                column.byteswap()
            parts.append(column.tobytes())
        else:  # numpy
            parts.append(column.astype("<" + _NUMPY[code], copy=False).tobytes())
    return b"".join(parts)


def write(rows: Rows, path: Path) -> None:
    """``path`` written whole or not at all (a temporary beside it, then renamed)."""
    files.atomic_write_bytes(str(path), encode(rows))


_NUMPY = {"I": "u4", "q": "i8", "d": "f8", "i": "i4", "B": "u1"}
_WIDTH = {"I": 4, "q": 8, "d": 8, "i": 4, "B": 1}


def _parse_head(path: Path, data: bytes) -> tuple[dict[str, Any], int]:
    """The head of a rows file whose first bytes are ``data``, and where its columns start."""
    if not data.startswith(MAGIC):
        raise files.TraceError(f"{path}: not an autoannot rows file")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise files.TraceError(f"{path}: cut short or damaged (no end to its head)")
    try:
        head = json.loads(data[len(MAGIC):end])
        if not isinstance(head, dict):
            raise TypeError("not an object")
        if head.get("version") not in READABLE:
            raise files.TraceError(f"{path}: rows of version {head.get('version')!r}; this "
                                   f"autoannot reads versions {', '.join(map(str, READABLE))}")
        head["count"], head["rank"] = int(head["count"]), int(head["rank"])
        head["columns"] = [(str(n), str(c)) for n, c in head["columns"]]
        if any(code not in _WIDTH for _, code in head["columns"]):
            raise ValueError("an unknown column type")
    except (ValueError, KeyError, TypeError) as exc:
        raise files.TraceError(f"{path}: the rows file's head is damaged ({exc})") from None
    return head, end + 1


def _rows_of_head(head: dict[str, Any], columns: dict[str, Any]) -> Rows:
    known = {"version", "rank", "run", "host", "clock", "base_ns", "source", "count",
             "byteorder", "columns", "groups", "collectives", "sites"}
    return Rows(head["rank"], columns, list(head.get("groups", [])),
                list(head.get("collectives", [])), list(head.get("sites", [])),
                head.get("run"), head.get("host"), str(head.get("clock", "trace")),
                head.get("base_ns"), str(head.get("source", "")),
                {k: v for k, v in head.items() if k not in known})


def read_head(path: Path) -> tuple[Rows, int]:
    """A rows file's head (its ``Rows`` with no columns) and its row count, without reading
    the columns."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(1 << 16)
            while data.startswith(MAGIC) and b"\n" not in data[len(MAGIC):]:
                more = handle.read(1 << 20)
                if not more:
                    break
                data += more
    except OSError as exc:
        raise files.TraceError(f"{path}: cannot read: {exc.strerror}") from None
    head, _ = _parse_head(path, data)
    rows = _rows_of_head(head, {})
    rows.path, rows.count = Path(path), head["count"]
    return rows, head["count"]


def read(path: Path, numpy: bool = False) -> Rows:
    """A rows file; TraceError where it is none, or cut short. ``numpy``: the columns as numpy
    arrays (views of the file's bytes)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise files.TraceError(f"{path}: cannot read: {exc.strerror}") from None
    head, offset = _parse_head(path, data)
    count = head["count"]
    needed = sum(_WIDTH[code] for _, code in head["columns"]) * count
    if len(data) - offset != needed:
        raise files.TraceError(f"{path}: cut short or damaged ({len(data) - offset} bytes of "
                               f"columns, {needed} expected for {count} rows)")
    columns: dict[str, Any] = {}
    if numpy:
        import numpy as np

    for name, code in head["columns"]:
        size = _WIDTH[code] * count
        if numpy:
            columns[name] = np.frombuffer(data, dtype="<" + _NUMPY[code], count=count,
                                          offset=offset)
        else:
            column = array(code)
            column.frombytes(data[offset:offset + size])
            if sys.byteorder != "little":
                column.byteswap()
            columns[name] = column
        offset += size
    if "step" not in columns:  # (version 1: no steps)
        columns["step"] = (np.full(count, -1, dtype="<i4") if numpy
                           else array("i", [-1]) * count)
    rows = _rows_of_head(head, columns)
    rows.path, rows.count = Path(path), count
    return rows


def to_launches(rows: Rows) -> list[Launch]:
    """The rows as ``Launch``es (for joining with traces and record files)."""
    c = rows.columns
    launches = []
    for i in range(len(rows)):
        group = rows.groups[int(c["group"][i])]
        end = float(c["end_us"][i])
        site = int(c["site"][i])
        launches.append(Launch(
            rows.rank, str(group["name"]), int(c["seq"][i]),
            rows.collectives[int(c["collective"][i])], int(c["size_bytes"][i]),
            int(group.get("size", 1)), float(c["start_us"][i]), None if end != end else end,
            rows.sites[site] if site >= 0 else None, str(group.get("desc", "")),
            kernel=bool(c["kernel"][i]), step=int(c["step"][i]),
            group_ranks=tuple(group["ranks"]) if isinstance(group.get("ranks"), list)
            else None))
    return launches

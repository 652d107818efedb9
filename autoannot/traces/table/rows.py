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
import os
import stat
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoannot.traces import files
from autoannot.traces.table.launch import Launch

MAGIC = b"AUTOANNOT-ROWS 1\n"
#: 2 added the "step" and "dtype" columns and each group's "ranks"; files of version 1 read
#: with step -1 and dtype "".
VERSION = 2
READABLE = (1, 2)
#: A rows file beside ``NAME.json``: ``NAME.rows`` (as the ledger is ``NAME.autoannot``).
SUFFIX = ".rows"
#: The same rows as Parquet (where the job has pyarrow): ``NAME.rows.parquet``.
PARQUET_SUFFIX = ".rows.parquet"

#: The "kernel" column's value of a launch timed by the GPU's events (a ring's GPU times).
GPU_EVENTS = 2
#: (column, array typecode): the order and width of the columns in the file.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("group", "I"),  # index into the head's "groups"
    ("seq", "q"),  # position in the group's sequence on this rank
    ("collective", "I"),  # index into "collectives"
    ("size_bytes", "q"),
    ("start_us", "d"),  # in the head's time base ("base_ns"; see "clock")
    ("end_us", "d"),  # NaN where only the entry is known
    ("site", "i"),  # index into "sites"; -1: none
    ("kernel", "B"),  # 1: timed by a GPU kernel (ends within microseconds on every rank);
    # 2: timed by the GPU's events around it (a ring's GPU times: ``keep/gpu_clock.py``)
    ("step", "i"),  # the profiler step it ran in (ProfilerStep#N); -1: none known
    ("dtype", "I"),  # index into "dtypes" ("Float", ...; "": unknown)
)


def rows_path(trace_path: str | Path, parquet: bool = False) -> Path:
    """Where the rows of the trace ``trace_path`` go: beside it, ``NAME.rows`` (or
    ``NAME.rows.parquet``)."""
    from autoannot.traces.names import trace_stem

    return Path(trace_stem(trace_path) + (PARQUET_SUFFIX if parquet else SUFFIX))


def rows_beside(trace_path: str | Path) -> Path | None:
    """The rows a job wrote beside a trace (Parquet first), or None."""
    for parquet in (True, False):
        path = rows_path(trace_path, parquet)
        if is_rows(path):
            return path
    return None


def is_rows_name(path: Path) -> bool:
    """Whether ``path`` is named as rows are (``*.rows``, ``*.rows.parquet``)."""
    return path.name.endswith((SUFFIX, PARQUET_SUFFIX))


def is_rows(path: str | os.PathLike[str], regular: bool = False) -> bool:
    """Whether ``path`` is a rows file, of either format (a regular file only: a FIFO is
    never opened; ``regular``: the caller knows it is one). Its first bytes read with one
    system call: thousands of ranks' files are asked of."""
    name = os.fspath(path)
    if not name.endswith((SUFFIX, PARQUET_SUFFIX)):
        return False
    magic = b"PAR1" if name.endswith(PARQUET_SUFFIX) else MAGIC
    try:
        if not regular and not stat.S_ISREG(os.stat(name).st_mode):
            return False
        fd = os.open(name, os.O_RDONLY)
        try:
            return os.pread(fd, len(magic), 0) == magic
        finally:
            os.close(fd)
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
    dtypes: list[str] = field(default_factory=lambda: [""])  # what "dtype" indexes
    #: A binary rows file's columns as its head lists them, and where they begin (``read_head``:
    #: the columns are read by row range from there).
    layout: list[tuple[str, str]] | None = None
    data_offset: int | None = None

    def __len__(self) -> int:
        return len(self.columns["seq"]) if self.columns else self.count


def from_launches(launches: list[Launch], rank: int, **head: Any) -> Rows:
    """Rows of ``launches`` (``launch.Launch``) of one rank."""
    groups: dict[str, int] = {}
    group_facts: list[dict[str, Any]] = []
    collectives: dict[str, int] = {}
    sites: dict[str, int] = {}
    dtypes: dict[str, int] = {}
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
        columns["kernel"].append(GPU_EVENTS if launch.gpu else 1 if launch.kernel else 0)
        columns["step"].append(launch.step)
        columns["dtype"].append(dtypes.setdefault(launch.dtype, len(dtypes)))
    return Rows(rank, columns, group_facts, list(collectives), list(sites),
                dtypes=list(dtypes) or [""], **head)


def with_extents(rows: Rows) -> list[dict[str, Any]]:
    """The head's groups, each with its launches here and the first and last seq of them
    (``"launches"``, ``"seq"``): what an analysis cuts its partitions by, with no column read.
    (Standard library only: the job writes this.)"""
    if not rows.columns:
        return rows.groups
    if not isinstance(rows.columns["seq"], array):  # numpy (readers, tools): whole-array
        import numpy as np

        group = np.asarray(rows.columns["group"], np.int64)
        seq = np.asarray(rows.columns["seq"], np.int64)
        found = np.bincount(group, minlength=len(rows.groups))
        low_of = np.full(len(rows.groups), np.iinfo(np.int64).max)
        high_of = np.full(len(rows.groups), -1)
        np.minimum.at(low_of, group, seq)
        np.maximum.at(high_of, group, seq)
        return [{**g, "launches": int(found[i]), "seq": [int(low_of[i]), int(high_of[i])]}
                if found[i] else {**g, "launches": 0} for i, g in enumerate(rows.groups)]
    count = [0] * len(rows.groups)
    low: list[int | None] = [None] * len(rows.groups)
    high: list[int | None] = [None] * len(rows.groups)
    for g, seq in zip(rows.columns["group"], rows.columns["seq"], strict=True):
        g, seq = int(g), int(seq)
        count[g] += 1
        low[g] = seq if low[g] is None or seq < low[g] else low[g]  # type: ignore[operator]
        high[g] = seq if high[g] is None or seq > high[g] else high[g]  # type: ignore[operator]
    return [{**g, "launches": count[i], "seq": [low[i], high[i]]} if count[i] else
            {**g, "launches": 0} for i, g in enumerate(rows.groups)]


def encode(rows: Rows) -> bytes:
    head = {"version": VERSION, "rank": rows.rank, "run": rows.run, "host": rows.host,
            "clock": rows.clock, "base_ns": rows.base_ns, "source": rows.source,
            "count": len(rows), "byteorder": "little", "columns": [list(c) for c in COLUMNS],
            "groups": with_extents(rows), "collectives": rows.collectives, "sites": rows.sites,
            "dtypes": rows.dtypes,
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
             "byteorder", "columns", "groups", "collectives", "sites", "dtypes"}
    return Rows(head["rank"], columns, list(head.get("groups", [])),
                list(head.get("collectives", [])), list(head.get("sites", [])),
                head.get("run"), head.get("host"), str(head.get("clock", "trace")),
                head.get("base_ns"), str(head.get("source", "")),
                {k: v for k, v in head.items() if k not in known},
                dtypes=list(head.get("dtypes", [""])) or [""])


def read_head(path: Path) -> tuple[Rows, int]:
    """A rows file's head (its ``Rows`` with no columns) and its row count, without reading
    the columns."""
    path = path if isinstance(path, Path) else Path(path)
    if path.name.endswith(PARQUET_SUFFIX):
        return _parquet_head(path)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, 1 << 13, 0)  # (a head is a few KB: not the columns after it)
            while data.startswith(MAGIC) and b"\n" not in data[len(MAGIC):]:
                more = os.pread(fd, max(1 << 16, len(data)), len(data))
                if not more:
                    break
                data += more
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
    except OSError as exc:
        raise files.TraceError(f"{path}: cannot read: {exc.strerror}") from None
    head, at = _parse_head(path, data)
    rows = _rows_of_head(head, {})
    rows.path, rows.count = path, head["count"]
    rows.layout, rows.data_offset = head["columns"], at
    needed = sum(_WIDTH[code] for _, code in head["columns"]) * head["count"]
    if size - at != needed:
        raise files.TraceError(f"{path}: cut short or damaged ({size - at} bytes of columns, "
                               f"{needed} expected for {head['count']} rows)")
    return rows, head["count"]


def read(path: Path, numpy: bool = False) -> Rows:
    """A rows file; TraceError where it is none, or cut short. ``numpy``: the columns as numpy
    arrays (views of the file's bytes). Parquet rows are read with pyarrow."""
    if Path(path).name.endswith(PARQUET_SUFFIX):
        return _read_parquet(Path(path))
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
    if "step" not in columns:  # (version 1: no steps, no dtypes)
        columns["step"] = (np.full(count, -1, dtype="<i4") if numpy
                           else array("i", [-1]) * count)
    if "dtype" not in columns:
        columns["dtype"] = (np.zeros(count, dtype="<u4") if numpy
                            else array("I", [0]) * count)
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
            kernel=int(c["kernel"][i]) == 1, gpu=int(c["kernel"][i]) == GPU_EVENTS,
            step=int(c["step"][i]),
            dtype=rows.dtypes[int(c["dtype"][i])],
            group_ranks=tuple(group["ranks"]) if isinstance(group.get("ranks"), list)
            else None))
    return launches


# --- Parquet: the same table, for any tool ------------------------------------------------------

#: The Parquet schema: one row per launch of one rank, every value spelled out (strings are
#: dictionary-encoded by Parquet: a name repeated on every row costs almost nothing). pandas,
#: polars, DuckDB and Spark read it with no autoannot import; docs/tools.md documents it.
PARQUET_COLUMNS: tuple[tuple[str, str], ...] = (
    ("rank", "int32"), ("run", "string"), ("host", "string"),
    ("group", "string"), ("group_desc", "string"), ("group_size", "int32"),
    ("group_ranks", "list<int32>"),  # null where the inputs do not name them all
    ("seq", "int64"), ("collective", "string"), ("dtype", "string"), ("size_bytes", "int64"),
    ("step", "int32"),  # the profiler step (ProfilerStep#N); null: none known
    ("call_site", "string"),  # null: none recorded
    ("start_us", "float64"), ("end_us", "float64"),  # end null: only the entry is known
    ("timed_by", "string"),  # "kernel" (a GPU kernel), "cpu" (a CPU range: gloo), "entry",
    # "gpu" (a ring's GPU times: start when the rank's GPU reached it, end when its stream
    # could go on; null end where the call returned a Work)
    ("time_base", "string"),  # "trace": us from base_ns; "wall": us since the epoch
    ("base_ns", "int64"),  # the wall-clock time of the time base's zero; null: unknown
)
_HEAD_KEY = b"autoannot.rows"


def parquet_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("pyarrow") is not None


def encode_parquet(rows: Rows) -> bytes:
    """The rows as a Parquet file's bytes (pyarrow)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    c = {name: np.asarray(rows.columns[name]) for name, _ in COLUMNS}
    count = len(rows)

    def strings(codes: Any, names: list[str], missing: int | None = None) -> Any:
        codes = np.asarray(codes, dtype=np.int32)
        mask = None if missing is None else codes == missing
        return pa.DictionaryArray.from_arrays(
            pa.array(np.where(codes < 0, 0, codes), pa.int32(), mask=mask),
            pa.array(names or [""], pa.string()))

    def constant(value: Any, kind: Any) -> Any:
        return pa.repeat(pa.scalar(value, kind), count)

    groups = rows.groups
    group_codes = c["group"].astype(np.int32)
    # each row's group's ranks: the groups' lists, taken by code (no Python list a row)
    ranks_of = pa.array([g.get("ranks") if isinstance(g.get("ranks"), list) else None
                         for g in groups] or [None], pa.list_(pa.int32()))
    end = c["end_us"].astype(np.float64)
    timed_by = np.where(c["kernel"] == 1, 0, np.where(
        c["kernel"] == GPU_EVENTS, 3, np.where(np.isnan(end), 2, 1)))
    table = pa.table({
        "rank": constant(rows.rank, pa.int32()), "run": constant(rows.run, pa.string()),
        "host": constant(rows.host, pa.string()),
        "group": strings(group_codes, [str(g["name"]) for g in groups]),
        "group_desc": strings(group_codes, [str(g.get("desc", "")) for g in groups]),
        "group_size": pa.array(np.array([int(g.get("size", 1)) for g in groups] or [1],
                                        np.int32)[group_codes], pa.int32()),
        "group_ranks": ranks_of.take(pa.array(group_codes)),
        "seq": pa.array(c["seq"].astype(np.int64)),
        "collective": strings(c["collective"], rows.collectives),
        "dtype": strings(c["dtype"], rows.dtypes),
        "size_bytes": pa.array(c["size_bytes"].astype(np.int64)),
        "step": pa.array(c["step"].astype(np.int32), mask=c["step"] < 0),
        "call_site": strings(c["site"], rows.sites, missing=-1),
        "start_us": pa.array(c["start_us"].astype(np.float64)),
        "end_us": pa.array(end, mask=np.isnan(end)),
        "timed_by": strings(timed_by, ["kernel", "cpu", "entry", "gpu"]),
        "time_base": constant(rows.clock, pa.string()),
        "base_ns": constant(rows.base_ns, pa.int64()),
    })
    head = {"version": VERSION, "rank": rows.rank, "run": rows.run, "host": rows.host,
            "clock": rows.clock, "base_ns": rows.base_ns, "source": rows.source,
            "count": count, "groups": with_extents(rows), "collectives": rows.collectives,
            "sites": rows.sites, "dtypes": rows.dtypes, **rows.extra}
    table = table.replace_schema_metadata({_HEAD_KEY: json.dumps(head).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def write_parquet(rows: Rows, path: Path) -> None:
    """``path`` written whole or not at all."""
    files.atomic_write_bytes(str(path), encode_parquet(rows))


def _parquet_head(path: Path) -> tuple[Rows, int]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise files.TraceError(f"{path}: Parquet rows need pyarrow (pip install pyarrow)") \
            from None
    try:
        meta = pq.read_metadata(path)
        head = json.loads((meta.metadata or {})[_HEAD_KEY])
    except (OSError, KeyError, ValueError) as exc:
        raise files.TraceError(f"{path}: not autoannot's Parquet rows, or damaged ({exc})") \
            from None
    known = {"version", "rank", "run", "host", "clock", "base_ns", "source", "count", "groups",
             "collectives", "sites", "dtypes"}
    one = Rows(int(head["rank"]), {}, list(head.get("groups", [])),
               list(head.get("collectives", [])), list(head.get("sites", [])),
               head.get("run"), head.get("host"), str(head.get("clock", "trace")),
               head.get("base_ns"), str(head.get("source", "")),
               {k: v for k, v in head.items() if k not in known},
               dtypes=list(head.get("dtypes", [""])) or [""])
    one.path, one.count = path, meta.num_rows
    return one, meta.num_rows


def _read_parquet(path: Path) -> Rows:
    """Parquet rows as ``Rows`` (numpy columns; strings as codes into their tables)."""
    import numpy as np

    head, count = _parquet_head(path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise files.TraceError(f"{path}: cannot read its Parquet ({exc})") from None
    missing = {name for name, _ in PARQUET_COLUMNS} - set(table.column_names)
    if missing:
        raise files.TraceError(f"{path}: Parquet rows without {', '.join(sorted(missing))}")

    def codes(name: str, names: list[str]) -> tuple[Any, list[str]]:
        """A string column as codes into ``names`` (the head's table, extended by any name
        it lacks); -1 for nulls."""
        column = table.column(name).combine_chunks()
        if not pa.types.is_dictionary(column.type):
            column = column.dictionary_encode()
        names = list(names)
        where = {n: i for i, n in enumerate(names)}
        lookup = np.array([where.setdefault(n, len(where)) for n in
                           column.dictionary.to_pylist()] or [0], dtype=np.int32)
        names += [n for n in list(where)[len(names):]]
        indices = column.indices.fill_null(0).to_numpy(zero_copy_only=False)
        valid = column.indices.is_valid().to_numpy(zero_copy_only=False)
        return np.where(valid, lookup[indices.astype(np.intp)], -1).astype(np.int32), names

    group, group_names = codes("group", [str(g["name"]) for g in head.groups])
    known = {str(g["name"]): g for g in head.groups}
    first = {int(g): int(i) for i, g in reversed(list(enumerate(group.tolist())))}
    descs = table.column("group_desc").to_pylist() if first else []
    sizes = table.column("group_size").to_numpy() if first else []
    ranks = table.column("group_ranks").to_pylist() if first else []
    groups = []
    for code, name in enumerate(group_names):
        at = first.get(code)
        if name in known or at is None:
            groups.append(known.get(name, {"name": name, "desc": "", "size": 1}))
            continue
        fact = {"name": name, "desc": descs[at], "size": int(sizes[at])}
        if ranks[at] is not None:
            fact["ranks"] = ranks[at]
        groups.append(fact)
    collective, collectives = codes("collective", head.collectives)
    dtype, dtypes = codes("dtype", head.dtypes)
    site, sites = codes("call_site", head.sites)
    step = table.column("step").to_numpy(zero_copy_only=False)
    timed_by = table.column("timed_by").to_pylist() if count else []
    columns = {
        "group": group.astype(np.uint32), "seq": table.column("seq").to_numpy(),
        "collective": collective.astype(np.uint32),
        "size_bytes": table.column("size_bytes").to_numpy(),
        "start_us": table.column("start_us").to_numpy(),
        "end_us": table.column("end_us").to_numpy(zero_copy_only=False).astype(np.float64),
        "site": site, "kernel": np.array([1 if t == "kernel" else GPU_EVENTS if t == "gpu"
                                          else 0 for t in timed_by], dtype=np.uint8),
        "step": np.where(np.isnan(step.astype(np.float64)), -1, step).astype(np.int32),
        "dtype": dtype.astype(np.uint32)}
    head.columns, head.groups = columns, groups
    head.collectives, head.sites, head.dtypes = collectives, sites, dtypes or [""]
    return head


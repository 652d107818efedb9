"""Ring files (``AUTOANNOT_RING``'s, see ``keep/ring.py``) as read by the tools: one rank's
last launches in order, with what each launch and call site was. Read while the job writes
them: a launch is counted in the header only once its record is whole, and a names line not
yet ended is left for the next look."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autoannot.base import ring_format as ring
from autoannot.traces import files

#: A record's columns, as ``ring.RECORD`` packs them.
DTYPE = np.dtype([("seq", "<i8"), ("entered_ns", "<i8"), ("returned_ns", "<i8"),
                  ("finished_ns", "<i8"), ("kind", "<u4"), ("site", "<u4"),
                  ("finished_thread", "<u4"), ("pad", "V4")])
assert DTYPE.itemsize == ring.RECORD.size


@dataclass
class RingRead:
    """One rank's ring: its first names line (``meta``), its kinds and call sites by id, how
    many launches it entered (``count``), and the last ``min(count, capacity)`` of them,
    oldest first (``records``: ``DTYPE``)."""

    path: Path
    meta: dict[str, Any]
    kinds: dict[int, dict[str, Any]]
    sites: dict[int, str]
    count: int
    records: Any = field(repr=False)

    @property
    def rank(self) -> int | None:
        return self.meta.get("rank")

    def wall_ns(self, monotonic_ns: Any) -> Any:
        """Times of the ring's monotonic clock on the wall clock (its anchor: the names file's
        first line)."""
        return self.meta["wall_ns"] + (monotonic_ns - self.meta["monotonic_ns"])


def is_ring(path: str | os.PathLike[str]) -> bool:
    return str(path).endswith(ring.SUFFIX)


def names_of(path: Path) -> Path:
    return path.with_name(path.name[:-len(ring.SUFFIX)] + ring.NAMES_SUFFIX)


def read(path: Path, last: int | None = None) -> RingRead:
    """One ring file and its names (``last``: its last launches alone, at most that many).
    TraceError for a file that is no ring or has no names."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            count, records = _records(path, lambda n, at: os.pread(fd, n, at), last)
        finally:
            os.close(fd)
    except OSError as exc:
        raise files.TraceError(f"{path}: {exc.strerror or exc}") from None
    meta, kinds, sites = _names(names_of(path))
    return RingRead(path, meta, kinds, sites, count, records)


def read_held(data: bytes, names: list[dict[str, Any]], label: str) -> RingRead:
    """A ring held in memory (``keep.ring.Ring(None).held()``: its bytes and its names'
    lines), read as its files would be; ``label`` stands for its path in messages."""
    path = Path(label)
    count, records = _records(path, lambda n, at: data[at:at + n], None)
    meta, kinds, sites = _names_of_lines(path, names)
    return RingRead(path, meta, kinds, sites, count, records)


def _records(path: Path, read_at: Any, last: int | None) -> tuple[int, Any]:
    """A ring's count and its last launches, oldest first (``read_at(n, offset)``: its bytes
    there)."""
    head = read_at(ring.HEADER_BYTES, 0)
    if len(head) < ring.HEADER_BYTES or head[:8] != ring.MAGIC:
        raise files.TraceError(f"{path}: not an autoannot ring file of this version")
    _, record_bytes, capacity = ring.HEADER.unpack_from(head)
    if record_bytes != ring.RECORD.size:
        raise files.TraceError(f"{path}: records of {record_bytes} bytes (this "
                               f"autoannot reads {ring.RECORD.size})")
    (count,) = ring.COUNT.unpack_from(head, ring.COUNT_AT)
    kept = min(count, capacity, capacity if last is None else last)
    parts = []  # (launch count-kept .. count-1: at most two runs of slots)
    first = count - kept
    while first < count:
        slot = first % capacity
        n = min(count - first, capacity - slot)
        data = read_at(n * record_bytes, ring.HEADER_BYTES + slot * record_bytes)
        if len(data) < n * record_bytes:
            raise files.TraceError(f"{path}: cut short (a ring of {capacity} records)")
        parts.append(np.frombuffer(data, DTYPE))
        first += n
    records = (np.concatenate(parts) if len(parts) > 1 else parts[0] if parts
               else np.zeros(0, DTYPE))
    return count, records


def _names(path: Path) -> tuple[dict[str, Any], dict[int, dict[str, Any]], dict[int, str]]:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise files.TraceError(f"{path}: {exc.strerror or exc} (a ring's names)") from None
    # (the last line: empty, or one still being written)
    return _names_of_lines(path, [json.loads(line) for line in text.split(b"\n")[:-1]])


def _names_of_lines(path: Path, lines: list[dict[str, Any]]
                    ) -> tuple[dict[str, Any], dict[int, dict[str, Any]], dict[int, str]]:
    meta: dict[str, Any] | None = None
    kinds: dict[int, dict[str, Any]] = {}
    sites: dict[int, str] = {}
    for entry in lines:
        if "ring" in entry:
            meta = entry
        elif "kind" in entry:
            kinds[int(entry["kind"])] = entry
        elif "site" in entry:
            sites[int(entry["site"])] = str(entry["call_site"])
    if meta is None:
        raise files.TraceError(f"{path}: names no ring")
    return meta, kinds, sites


def in_folder(folder: Path) -> list[Path]:
    """The ring files in ``folder``, by name."""
    with os.scandir(folder) as listing:
        return sorted(Path(e.path) for e in listing if is_ring(e.name) and e.is_file())


def launches_of(one: RingRead) -> list[Any]:
    """A ring's collectives as launches (``table.launch.Launch``), entered on the wall clock
    (the ring's anchor). Known by their entry (a return is a completion only for a call that
    blocks: the ring does not say which did), and by their completion where the ring has it
    (an async launch on the CPU: ``finished_wall_us``, and ``finished_thread``: the thread
    that told it, where gloo ran it)."""
    from autoannot.describe import vocabulary as V
    from autoannot.traces.read import record_files
    from autoannot.traces.read.rank_files import group_ranks
    from autoannot.traces.table.launch import Launch

    rank = -1 if one.rank is None else int(one.rank)
    records = one.records
    wall_us = one.wall_ns(records["entered_ns"]) / 1e3
    finished = records["finished_ns"]
    finished_us = one.wall_ns(finished) / 1e3
    threads = records["finished_thread"]
    made: dict[int, tuple[Any, ...] | None] = {}
    found = []
    for i in range(len(records)):
        k = int(records["kind"][i])
        facts = made.get(k, ())
        if facts == ():
            kind = one.kinds.get(k)
            annotation = kind["annotation"] if kind else {}
            facts = made[k] = None if V.COLLECTIVE_NAME not in annotation else (
                kind["group"], str(annotation[V.COLLECTIVE_NAME]),
                record_files.size_of(annotation)[2], int(annotation.get(V.GROUP_SIZE, 1)),
                str(annotation.get(V.PG_DESC, "")), group_ranks(annotation),
                str(annotation.get(V.DTYPE, "")))
        if facts is None:
            continue  # (a point-to-point block: no collective instance)
        group, name, size, group_size, desc, ranks, dtype = facts
        at = float(wall_us[i])
        found.append(Launch(rank, group, int(records["seq"][i]), name, size, group_size, at,
                            None, one.sites.get(int(records["site"][i])), desc,
                            wall_us=at, group_ranks=ranks, dtype=dtype,
                            finished_wall_us=float(finished_us[i]) if finished[i] else None,
                            finished_thread=int(threads[i]) or None))
    return found


def rows_of(paths: list[Path]) -> list[Any]:
    """Each ring's rows (``rows.Rows``, in memory), with its run; ``extra`` says how many
    launches the ring keeps and how many the rank entered."""
    from autoannot.traces.table import rows

    made = []
    for path in paths:
        one = read(path)
        if one.rank is None:
            raise files.TraceError(f"{path}: a ring of a process with no rank")
        made.append(rows.from_launches(
            launches_of(one), int(one.rank), clock="wall", source=path.name,
            run=one.meta.get("run"), host=one.meta.get("host"),
            extra={"ring_capacity": one.meta.get("capacity"), "ring_entered": one.count}))
    return made

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
#: A GPU file's record's columns (``ring.GPU_RECORD``).
GPU_DTYPE = np.dtype([("index", "<i8"), ("start_ns", "<i8"), ("end_ns", "<i8")])
assert GPU_DTYPE.itemsize == ring.GPU_RECORD.size


@dataclass(frozen=True)
class GpuState:
    """A rank's GPU clock as it last said (``ring.GPU_STATE``): when it last looked (host
    monotonic ns), the ring index of the oldest timed launch its GPU has not started (None:
    none) and when that launch was entered, and the conversion's error bound (ns)."""

    looked_ns: int
    waiting: int | None
    waiting_entered_ns: int
    error_ns: int


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
    #: The records' GPU start and end (``start_ns``, ``end_ns``: host monotonic, 0 unknown),
    #: one a record, where the ring has a GPU file (``keep/gpu_clock.py``); else None.
    gpu: Any = field(default=None, repr=False)
    gpu_state: GpuState | None = None

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
    gpu, state = gpu_times(gpu_of(path), count, len(records))
    return RingRead(path, meta, kinds, sites, count, records, gpu, state)


def gpu_of(path: Path) -> Path:
    """The GPU file beside a ring."""
    return path.with_name(path.name[:-len(ring.SUFFIX)] + ring.GPU_SUFFIX)


def gpu_times(path: Path, count: int, kept: int) -> tuple[Any, GpuState | None]:
    """The GPU times of a ring's last ``kept`` launches (of ``count``) from its GPU file
    (``start_ns``/``end_ns`` a launch, 0 where unknown), and its clock's state; (None, None)
    where there is no GPU file. TraceError for one that is no GPU file or cut short."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        raise files.TraceError(f"{path}: {exc.strerror or exc}") from None
    if len(data) < ring.HEADER_BYTES or data[:8] != ring.GPU_MAGIC:
        raise files.TraceError(f"{path}: not an autoannot GPU times file of this version")
    _, record_bytes, capacity = ring.GPU_HEADER.unpack_from(data)
    if record_bytes != ring.GPU_RECORD.size or len(data) < ring.gpu_bytes(capacity):
        raise files.TraceError(f"{path}: cut short, or records of {record_bytes} bytes")
    looked, waiting, since, error = ring.GPU_STATE.unpack_from(data, ring.GPU_STATE_AT)
    state = GpuState(looked, None if waiting == ring.GPU_NONE else waiting, since, error)
    table = np.frombuffer(data, GPU_DTYPE, capacity, ring.HEADER_BYTES)
    index = np.arange(count - kept, count, dtype=np.int64)
    found = table[index % capacity] if capacity else np.zeros(kept, GPU_DTYPE)
    mine = found["index"] == index  # (a slot of a launch written over since: unknown)
    times = np.zeros(kept, [("start_ns", "<i8"), ("end_ns", "<i8")])
    times["start_ns"] = np.where(mine, found["start_ns"], 0)
    times["end_ns"] = np.where(mine, found["end_ns"], 0)
    return times, state


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
    gpu_start = one.gpu["start_ns"] if one.gpu is not None else None
    if gpu_start is not None:
        gpu_start_us = one.wall_ns(gpu_start) / 1e3
        gpu_end = one.gpu["end_ns"]
        gpu_end_us = one.wall_ns(gpu_end) / 1e3
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
        end = None
        on_gpu = gpu_start is not None and gpu_start[i] > 0
        if on_gpu:  # (the GPU's start: when the collective could begin on this rank)
            at = float(gpu_start_us[i])
            end = float(gpu_end_us[i]) if gpu_end[i] > 0 else None
        found.append(Launch(rank, group, int(records["seq"][i]), name, size, group_size, at,
                            end, one.sites.get(int(records["site"][i])), desc,
                            wall_us=at, group_ranks=ranks, dtype=dtype,
                            finished_wall_us=float(finished_us[i]) if finished[i] else None,
                            finished_thread=int(threads[i]) or None, gpu=on_gpu))
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

"""The ring file's layout (``AUTOANNOT_RING``), stated once: the runtime that writes it in Python
(``keep/ring.py``, where the layout is described) and in C++ (``native/ring_format.h``, made
from this module by ``c_header()``: a test holds the two equal), and the tools that read it
(``traces/read/ring_files.py``): a 64-byte header — ``MAGIC``, the record size and capacity
(``HEADER``), the launches entered so far (``COUNT`` at ``COUNT_AT``) — then ``capacity``
records (``RECORD``: seq, entered_ns, returned_ns, finished_ns, kind, site, finished_thread).
Imports nothing but ``struct``."""

from __future__ import annotations

import struct

MAGIC = b"AARING02"
HEADER = struct.Struct("<8sII")  # magic, record bytes, capacity
COUNT = struct.Struct("<Q")
COUNT_AT = 16
HEADER_BYTES = 64
RECORD = struct.Struct("<qqqqIII4x")  # seq, entered/returned/finished_ns, kind, site, thread
RETURNED_AT = 16  # the returned_ns field's offset in a record
FINISHED_AT = 24  # the finished_ns field's offset
FINISHED_THREAD_AT = 40  # the finished_thread field's
FINISHED = struct.Struct("<q")
THREAD = struct.Struct("<I")
RETURNED = struct.Struct("<q")
FAILED = -1  # returned_ns of a launch that raised
DEFAULT_LAUNCHES = 1 << 16
SUFFIX = ".ring"
NAMES_SUFFIX = ".ring.names"


_pack_into = RECORD.pack_into
_RECORD_BYTES = RECORD.size


def put_record(ring: bytearray | memoryview | object, capacity: int, count: int, seq: int,
               entered_ns: int, returned_ns: int, kind: int, site: int) -> int:
    """The one Python packer of a record: the ``count``-th launch of a ring of ``capacity``
    records (``ring``: its writable bytes) written at its place, not finished; where it lies.
    Its C++ twin is ``put_record`` in ``native/ring_hooks.cpp`` (a test packs both)."""
    at = HEADER_BYTES + (count % capacity) * _RECORD_BYTES
    _pack_into(ring, at, seq, entered_ns, returned_ns, 0, kind, site, 0)
    return at


def ring_bytes(capacity: int) -> int:
    """The size of a ring file of ``capacity`` records."""
    return HEADER_BYTES + capacity * RECORD.size


#: The GPU's times of a ring's launches (``keep/gpu_clock.py``), in a file beside the ring
#: (``rank{R}.ring.gpu``): a 64-byte header — ``GPU_MAGIC``, the record size and capacity (the
#: ring's: launch ``i`` of the ring has its GPU times at slot ``i % capacity``), then at
#: ``GPU_STATE_AT`` the clock's state (``GPU_STATE``: when it last looked, on the host's
#: monotonic clock; the oldest timed launch whose GPU start has not come, -1 for none; when
#: that launch was entered) and the anchor's error bound in ns — then ``capacity`` records
#: (``GPU_RECORD``: the ring's launch index, GPU start and end on the host's monotonic clock,
#: 0 where not known yet). Written by one thread of the rank; the ring's records and layout
#: are untouched, so a ring without one reads as before.
GPU_SUFFIX = ".ring.gpu"
GPU_MAGIC = b"AAGPU001"
GPU_HEADER = struct.Struct("<8sII")  # magic, record bytes, capacity
GPU_STATE = struct.Struct("<qqqq")  # looked_ns, waiting index, waiting entered_ns, error ns
GPU_STATE_AT = 24
GPU_RECORD = struct.Struct("<qqq")  # ring launch index, gpu start ns, gpu end ns
GPU_NONE = -1  # the waiting index where no timed launch waits for its GPU


def gpu_bytes(capacity: int) -> int:
    """The size of a ring's GPU file of ``capacity`` records."""
    return HEADER_BYTES + capacity * GPU_RECORD.size


#: The c10d store keys of a rank's published progress (``AUTOANNOT_WATCH_STORE``): its launch
#: count (``b"COUNT PUBLISHED_NS RUN"``, read at every look) and its progress document.
COUNT_KEY = "autoannot/count/{rank}"
PROGRESS_KEY = "autoannot/progress/{rank}"


def count_key(rank: int) -> str:
    return COUNT_KEY.format(rank=rank)


def progress_key(rank: int) -> str:
    return PROGRESS_KEY.format(rank=rank)


#: A record's fields as ``RECORD`` packs them, in order: (name, C type).
FIELDS = (("seq", "int64_t"), ("entered_ns", "int64_t"), ("returned_ns", "int64_t"),
          ("finished_ns", "int64_t"), ("kind", "uint32_t"), ("site", "uint32_t"),
          ("finished_thread", "uint32_t"), ("pad", "uint32_t"))


def c_header() -> str:
    """``native/ring_format.h``: the layout above for the native writer (its record a struct
    whose fields lie where ``RECORD`` packs them, each offset asserted at compile time)."""
    codes = RECORD.format.lstrip("<").replace("4x", "I")  # (the pad read as a field)
    offsets = {name: struct.calcsize("<" + codes[:i]) for i, (name, _) in enumerate(FIELDS)}
    assert (offsets["returned_ns"], offsets["finished_ns"], offsets["finished_thread"]) == (
        RETURNED_AT, FINISHED_AT, FINISHED_THREAD_AT)
    fields = "\n".join(f"  {kind} {name};" for name, kind in FIELDS)
    asserts = "\n".join(f"static_assert(offsetof(AutoannotRecord, {name}) == {at}, "
                         f'"ring_format.RECORD: {name}");' for name, at in offsets.items())
    return f"""// Made by autoannot/base/ring_format.py (c_header()), where the layout is said once.
// Not to be edited: change ring_format.py and write this file anew (its test says how).
#pragma once

#include <cstddef>
#include <cstdint>

constexpr uint64_t kRingHeaderBytes = {HEADER_BYTES};  // HEADER_BYTES
constexpr uint64_t kRingCountAt = {COUNT_AT};  // COUNT_AT
constexpr uint64_t kRingReturnedAt = {RETURNED_AT};  // RETURNED_AT
constexpr int64_t kRingFailed = {FAILED};  // FAILED

// One record, as RECORD packs it ("{RECORD.format}"), little-endian.
struct AutoannotRecord {{
{fields}
}};
static_assert(sizeof(AutoannotRecord) == {RECORD.size}, "ring_format.RECORD's size");
{asserts}
"""

"""The ring file's layout (``AUTOANNOT_RING``), shared by the runtime that writes it
(``keep/ring.py``, where the layout is described) and the tools that read it
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


def ring_bytes(capacity: int) -> int:
    """The size of a ring file of ``capacity`` records."""
    return HEADER_BYTES + capacity * RECORD.size


#: The c10d store keys of a rank's published progress (``AUTOANNOT_WATCH_STORE``): its launch
#: count (``b"COUNT PUBLISHED_NS RUN"``, read at every look) and its progress document.
COUNT_KEY = "autoannot/count/{rank}"
PROGRESS_KEY = "autoannot/progress/{rank}"


def count_key(rank: int) -> str:
    return COUNT_KEY.format(rank=rank)


def progress_key(rank: int) -> str:
    return PROGRESS_KEY.format(rank=rank)

"""The ring file's layout (``AUTOANNOT_RING``), shared by the runtime that writes it
(``keep/ring.py``, where the layout is described) and the tools that read it
(``traces/read/ring_files.py``): a 64-byte header — ``MAGIC``, the record size and capacity
(``HEADER``), the launches entered so far (``COUNT`` at ``COUNT_AT``) — then ``capacity``
records (``RECORD``: seq, entered_ns, returned_ns, kind, site). Imports nothing but
``struct``."""

from __future__ import annotations

import struct

MAGIC = b"AARING01"
HEADER = struct.Struct("<8sII")  # magic, record bytes, capacity
COUNT = struct.Struct("<Q")
COUNT_AT = 16
HEADER_BYTES = 64
RECORD = struct.Struct("<qqqII")  # seq, entered_ns, returned_ns, kind, site
RETURNED_AT = 16  # the returned_ns field's offset in a record
RETURNED = struct.Struct("<q")
FAILED = -1  # returned_ns of a launch that raised
DEFAULT_LAUNCHES = 1 << 16
SUFFIX = ".ring"
NAMES_SUFFIX = ".ring.names"


def ring_bytes(capacity: int) -> int:
    """The size of a ring file of ``capacity`` records."""
    return HEADER_BYTES + capacity * RECORD.size

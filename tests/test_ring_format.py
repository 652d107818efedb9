"""The ring's record has one layout (``base/ring_format.py``) and one packer a language: the C++
header is made from the layout, and the Python and C++ packers write the same bytes for the
same fields."""

from __future__ import annotations

import mmap
import re
import struct
from pathlib import Path

from autoannot.base import ring_format

PACKAGE = Path(__file__).resolve().parents[1] / "autoannot"


def test_the_native_header_is_the_one_the_ring_format_makes() -> None:
    """``native/ring_format.h`` is ``c_header()``'s text: a change to the layout that is not
    carried to C++ fails here (regenerate: ``python -c "from autoannot.base import ring_format;
    print(ring_format.c_header(), end='')" > autoannot/native/ring_format.h``)."""
    header = (PACKAGE / "native" / "ring_format.h").read_text()
    assert header == ring_format.c_header()
    for name, _ in ring_format.FIELDS:
        assert f" {name};" in header


def test_a_record_is_packed_in_one_place_a_language() -> None:
    """In Python only ``ring_format.put_record`` packs a whole record; in C++ only
    ``put_record`` in ``ring_hooks.cpp`` builds one (the other writes are of one field, at
    its offset from the layout)."""
    python = [(path.relative_to(PACKAGE).as_posix(), line)
              for path in PACKAGE.rglob("*.py")
              for line in path.read_text().splitlines()
              if re.search(r"\bRECORD\.pack(_into)?\b", line)]
    assert python == [("base/ring_format.py", "_pack_into = RECORD.pack_into")]
    cpp = [(path.name, line.strip())
           for path in (PACKAGE / "native").glob("*.cpp")
           for line in path.read_text().splitlines()
           if re.search(r"\b(Record|AutoannotRecord)\s+\w+\s*[{=(]", line)]
    assert len(cpp) == 1 and cpp[0][0] == "ring_hooks.cpp", cpp


def _python_bytes(capacity: int, fields: list[tuple[int, int, int, int, int]],
                  first_seq: int) -> bytes:
    ring = bytearray(ring_format.ring_bytes(capacity))
    for count, (kind, site, _slot, entered, returned) in enumerate(fields):
        ring_format.put_record(ring, capacity, count, first_seq + count, entered, returned,
                               kind, site)
    return bytes(ring[ring_format.HEADER_BYTES:])


def test_python_and_cpp_pack_every_field_to_the_same_bytes(native_build, monkeypatch) -> None:
    """The same launches — every field at a value that fills its width, the ring wrapped
    once — packed by the Python packer and by the native writer (``ring_write_many``, which
    packs with ``put_record``) give the same record bytes."""
    monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(Path(native_build).parent.parent))
    from autoannot import native

    module = native.load()
    assert module is not None and hasattr(module, "ring_write_many")
    capacity, first_seq = 3, (1 << 40) + 7
    fields = [(0xFFFF_FFF0 + i, 0xABCD_0000 + i, 0, (1 << 62) + i, -1 if i == 2 else (1 << 61))
              for i in range(4)]  # (4 launches in a ring of 3: the first written over)
    mapping = mmap.mmap(-1, ring_format.ring_bytes(capacity))
    try:
        module.ring_attach(mapping, capacity, 0, [first_seq], None)
        ids = struct.Struct("<III")
        for kind, site, slot, entered, returned in fields:  # (one call each: its own times)
            module.ring_write_many(ids.pack(kind, site, slot), entered, returned)
        assert module.ring_count() == len(fields)
    finally:
        module.ring_detach()
    written = bytes(mapping[ring_format.HEADER_BYTES:])
    mapping.close()
    assert written == _python_bytes(capacity, fields, first_seq)
    last = ring_format.RECORD.unpack_from(written, ((len(fields) - 1) % capacity)
                                          * ring_format.RECORD.size)
    assert last == (first_seq + 3, (1 << 62) + 3, 1 << 61, 0, 0xFFFF_FFF3, 0xABCD_0003, 0)

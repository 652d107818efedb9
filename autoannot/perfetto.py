"""Write a (annotated) Kineto trace as a Perfetto protobuf trace (``.pftrace``), by hand.

One track per process and per thread/stream (annotated collectives sit on their process
group's lane), each ``"X"`` event a begin/end slice with its args as typed debug annotations
(ints stay ints). Perfetto shows only properly nested slices on a track, so an event that
overlaps another without nesting goes to an overflow track under the same lane. ``read`` parses
a file back (used to validate what ``write`` produced).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

# Field numbers of perfetto.protos (trace.proto, trace_packet.proto, track_event/*.proto).
TRACE_PACKET = 1
PACKET_TIMESTAMP, PACKET_SEQUENCE_ID, PACKET_TRACK_EVENT = 8, 10, 11
PACKET_SEQUENCE_FLAGS, PACKET_TRACK_DESCRIPTOR = 13, 60
DESC_UUID, DESC_NAME, DESC_PROCESS, DESC_THREAD, DESC_PARENT = 1, 2, 3, 4, 5
PROCESS_PID, PROCESS_NAME = 1, 6
THREAD_PID, THREAD_TID, THREAD_NAME = 1, 2, 5
EVENT_ANNOTATIONS, EVENT_TYPE, EVENT_TRACK, EVENT_CATEGORIES, EVENT_NAME = 4, 9, 11, 22, 23
SLICE_BEGIN, SLICE_END, INSTANT = 1, 2, 3
ANNOTATION_BOOL, ANNOTATION_INT, ANNOTATION_DOUBLE, ANNOTATION_STRING = 2, 4, 5, 6
ANNOTATION_NAME = 10
SEQUENCE_ID, INCREMENTAL_STATE_CLEARED = 1, 1


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s as two's complement, as protobuf does
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _int(field: int, value: int) -> bytes:
    return _tag(field, 0) + _varint(int(value))


def _bytes(field: int, value: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(value)) + value


def _str(field: int, value: str) -> bytes:
    return _bytes(field, value.encode("utf-8"))


def _double(field: int, value: float) -> bytes:
    import struct

    return _tag(field, 1) + struct.pack("<d", value)


def _annotation(name: str, value: Any) -> bytes:
    body = _str(ANNOTATION_NAME, name)
    if isinstance(value, bool):
        body += _int(ANNOTATION_BOOL, int(value))
    elif isinstance(value, int):
        body += _int(ANNOTATION_INT, value)
    elif isinstance(value, float):
        body += _double(ANNOTATION_DOUBLE, value)
    elif isinstance(value, str):
        body += _str(ANNOTATION_STRING, value)
    else:
        body += _str(ANNOTATION_STRING, json.dumps(value))
    return _bytes(EVENT_ANNOTATIONS, body)


def _packet(body: bytes, timestamp: int | None = None) -> bytes:
    head = _int(PACKET_SEQUENCE_ID, SEQUENCE_ID)
    if timestamp is not None:
        head += _int(PACKET_TIMESTAMP, timestamp)
    return _bytes(TRACE_PACKET, head + body)


def _uuid(*parts: Any) -> int:
    import hashlib

    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1 or 1


def _ns(us: Any) -> int:
    return round(float(us) * 1000)


def _nest(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split one thread's slices into tracks on which every slice nests (greedy)."""
    tracks: list[list[float]] = []  # per track: the stack of open slice ends
    placed: list[list[dict[str, Any]]] = []
    for event in sorted(events, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0)))):
        start = float(event["ts"])
        end = start + float(event.get("dur", 0))
        for i, stack in enumerate(tracks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                placed[i].append(event)
                break
        else:
            tracks.append([end])
            placed.append([event])
    return placed


def encode(events: list[dict[str, Any]]) -> bytes:
    """A Perfetto trace of Chrome-trace events."""
    process_names: dict[Any, str] = {}
    thread_names: dict[tuple[Any, Any], str] = {}
    slices: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    instants: list[dict[str, Any]] = []
    for event in events:
        phase = event.get("ph")
        key = (event.get("pid"), event.get("tid"))
        if phase == "M":
            name = str(event.get("args", {}).get("name", ""))
            if event.get("name") == "process_name":
                process_names[event.get("pid")] = name
            elif event.get("name") == "thread_name":
                thread_names[key] = name
        elif phase == "X" and "ts" in event:
            slices[key].append(event)
        elif phase in ("i", "I") and "ts" in event:
            instants.append(event)

    out = [_packet(_int(PACKET_SEQUENCE_FLAGS, INCREMENTAL_STATE_CLEARED))]
    pids = {pid for pid, _ in slices} | {e.get("pid") for e in instants}
    for pid in sorted(pids, key=str):
        process = _int(PROCESS_PID, pid if isinstance(pid, int) else 0)
        process += _str(PROCESS_NAME, process_names.get(pid, f"process {pid}"))
        desc = _int(DESC_UUID, _uuid("p", pid)) + _bytes(DESC_PROCESS, process)
        out.append(_packet(_bytes(PACKET_TRACK_DESCRIPTOR, desc)))
    for (pid, tid), thread_slices in sorted(slices.items(), key=lambda kv: str(kv[0])):
        name = thread_names.get((pid, tid), f"thread {tid}")
        for level, track_events in enumerate(_nest(thread_slices)):
            uuid = _uuid("t", pid, tid, level)
            desc = _int(DESC_UUID, uuid) + _int(DESC_PARENT, _uuid("p", pid))
            desc += _str(DESC_NAME, name if level == 0 else f"{name} (overlap {level})")
            if level == 0 and isinstance(pid, int) and isinstance(tid, int):
                desc += _bytes(DESC_THREAD, _int(THREAD_PID, pid) + _int(THREAD_TID, tid)
                               + _str(THREAD_NAME, name))
            out.append(_packet(_bytes(PACKET_TRACK_DESCRIPTOR, desc)))
            for event in track_events:
                begin = _int(EVENT_TYPE, SLICE_BEGIN) + _int(EVENT_TRACK, uuid)
                begin += _str(EVENT_NAME, str(event.get("name", "")))
                if event.get("cat"):
                    begin += _str(EVENT_CATEGORIES, str(event["cat"]))
                for key, value in (event.get("args") or {}).items():
                    begin += _annotation(str(key), value)
                start = _ns(event["ts"])
                out.append(_packet(_bytes(PACKET_TRACK_EVENT, begin), start))
                end = _int(EVENT_TYPE, SLICE_END) + _int(EVENT_TRACK, uuid)
                out.append(_packet(_bytes(PACKET_TRACK_EVENT, end),
                                   start + _ns(event.get("dur", 0))))
    for event in instants:
        body = _int(EVENT_TYPE, INSTANT) + _int(EVENT_TRACK, _uuid("p", event.get("pid")))
        body += _str(EVENT_NAME, str(event.get("name", "")))
        out.append(_packet(_bytes(PACKET_TRACK_EVENT, body), _ns(event["ts"])))
    return b"".join(out)


def write(events: list[dict[str, Any]], path: Path) -> None:
    """Write Chrome-trace events as a Perfetto trace at ``path`` (atomically)."""
    from autoannot import export

    export.atomic_write_bytes(path, encode(events))


# --- reading back ----------------------------------------------------------------------------

def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def fields(data: bytes) -> list[tuple[int, Any]]:
    """Decode one protobuf message: ``[(field number, int | bytes)]``; raises if malformed."""
    import struct

    out, pos = [], 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
        elif wire == 1:
            value = struct.unpack_from("<d", data, pos)[0]
            pos += 8
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated field")
            value, pos = data[pos:pos + length], pos + length
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.append((number, value))
    return out


def read(path: Path) -> list[dict[str, Any]]:
    """The packets of a ``.pftrace`` as dicts (timestamp, track descriptor or track event)."""
    packets = []
    for number, payload in fields(Path(path).read_bytes()):
        if number != TRACE_PACKET:
            raise ValueError(f"field {number} in a Trace")
        packet: dict[str, Any] = {}
        for field, value in fields(payload):
            if field == PACKET_TIMESTAMP:
                packet["ts"] = value
            elif field == PACKET_TRACK_DESCRIPTOR:
                desc = dict(fields(value))
                packet["track"] = {"uuid": desc.get(DESC_UUID),
                                   "parent": desc.get(DESC_PARENT),
                                   "name": desc.get(DESC_NAME, b"").decode()}
            elif field == PACKET_TRACK_EVENT:
                event: dict[str, Any] = {"args": {}}
                for f, v in fields(value):
                    if f == EVENT_TYPE:
                        event["type"] = v
                    elif f == EVENT_TRACK:
                        event["track"] = v
                    elif f == EVENT_NAME:
                        event["name"] = v.decode()
                    elif f == EVENT_ANNOTATIONS:
                        items = fields(v)
                        name = next(x for k, x in items if k == ANNOTATION_NAME).decode()
                        kind, raw = next((k, x) for k, x in items if k != ANNOTATION_NAME)
                        event["args"][name] = (raw.decode() if kind == ANNOTATION_STRING
                                               else bool(raw) if kind == ANNOTATION_BOOL
                                               else raw - (1 << 64) if kind == ANNOTATION_INT
                                               and raw >= 1 << 63 else raw)
                packet["event"] = event
        packets.append(packet)
    return packets

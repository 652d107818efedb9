"""Write a (annotated) Kineto trace as a Perfetto protobuf trace (``.pftrace``), by hand (no
dependency; the tests decode it with the official protos the ``perfetto`` package ships).

* One process per pid: the CPU process with its real pid and threads (named as Kineto named
  them), each GPU as a process named after Kineto's label ("GPU 0") whose streams are named
  tracks under it (a stream id is no OS thread id: two GPUs' stream 7 stay apart). A GPU's
  "pid" (its device index) and pids that are not numbers (Kineto's "Spans") are no OS pids:
  they get numbers of their own above any OS pid, never 0 (Perfetto's idle task). With the
  trace's rank known, names say it: "python3 (rank 0)", "GPU 0 (rank 0)".
* Each ``"X"`` event is a begin/end slice with its args as typed debug annotations (ints stay
  ints). Perfetto draws only properly nested slices on a track, so an event that overlaps
  another without nesting goes to an overflow track under the same parent.
* Flows (Kineto's ``ac2g`` arrows from a launch to its kernel) are kept: the slice a flow
  starts in carries its id in ``flow_ids``, the slice it ends in in ``terminating_flow_ids``.
* Packets: the track descriptors first, then every event in time order.
"""

from __future__ import annotations

import bisect
import heapq
import json
import struct
from collections import defaultdict
from pathlib import Path
from typing import Any

# Field numbers of perfetto.protos (trace.proto, trace_packet.proto, track_event/*.proto).
TRACE_PACKET = 1
PACKET_TIMESTAMP, PACKET_SEQUENCE_ID, PACKET_TRACK_EVENT = 8, 10, 11
PACKET_SEQUENCE_FLAGS, PACKET_TRACK_DESCRIPTOR = 13, 60
DESC_UUID, DESC_NAME, DESC_PROCESS, DESC_THREAD, DESC_PARENT = 1, 2, 3, 4, 5
PROCESS_PID, PROCESS_NAME, PROCESS_LABELS = 1, 6, 8
THREAD_PID, THREAD_TID, THREAD_NAME = 1, 2, 5
EVENT_ANNOTATIONS, EVENT_TYPE, EVENT_TRACK, EVENT_CATEGORIES, EVENT_NAME = 4, 9, 11, 22, 23
EVENT_FLOW_IDS, EVENT_TERMINATING_FLOW_IDS = 47, 48
SLICE_BEGIN, SLICE_END, INSTANT = 1, 2, 3
ANNOTATION_BOOL, ANNOTATION_INT, ANNOTATION_DOUBLE, ANNOTATION_STRING = 2, 4, 5, 6
ANNOTATION_NAME = 10
SEQUENCE_ID, INCREMENTAL_STATE_CLEARED = 1, 1
#: Numbers for pids that are not numbers: above any Linux pid (pid_max <= 2**22).
SYNTHETIC_PIDS = 1 << 22
#: Kineto categories of events that run on a device (their pid is a device, not a process).
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})


# --- protobuf, by hand -------------------------------------------------------------------------

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


def _fixed64(field: int, value: int) -> bytes:
    return _tag(field, 1) + struct.pack("<Q", value & ((1 << 64) - 1))


def _bytes(field: int, value: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(value)) + value


def _str(field: int, value: str) -> bytes:
    return _bytes(field, value.encode("utf-8"))


def _double(field: int, value: float) -> bytes:
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


# --- the trace's processes, tracks and slices ----------------------------------------------

class _Slice:
    __slots__ = ("end", "event", "flows_in", "flows_out", "start", "track")

    def __init__(self, event: dict[str, Any]) -> None:
        self.event = event
        self.start = _ns(event["ts"])
        self.end = self.start + max(0, _ns(event.get("dur", 0)))
        self.track = 0
        self.flows_out: list[int] = []  # flows that start in this slice
        self.flows_in: list[int] = []  # flows that end in it


def _nest(slices: list[_Slice]) -> list[list[_Slice]]:
    """Split one thread's slices into tracks on which every slice nests (greedy)."""
    tracks: list[list[int]] = []  # per track: the stack of open slice ends
    placed: list[list[_Slice]] = []
    for item in sorted(slices, key=lambda s: (s.start, -s.end)):
        for i, stack in enumerate(tracks):
            while stack and stack[-1] <= item.start:
                stack.pop()
            if not stack or item.end <= stack[-1]:
                stack.append(item.end)
                placed[i].append(item)
                break
        else:
            tracks.append([item.end])
            placed.append([item])
    return placed


def _enclosing(index: list[tuple[int, int, _Slice]], ts: int) -> _Slice | None:
    """The innermost slice of a thread that contains ``ts`` (``index`` sorted by start)."""
    position = bisect.bisect_right(index, (ts, 1 << 62))
    for i in range(position - 1, max(-1, position - 256), -1):
        start, end, item = index[i]
        if start <= ts <= end:
            return item
    return None


def _processes(events: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """pid -> {"pid": number, "name", "labels", "device"} for every pid with events (Kineto
    describes every GPU of the machine; those that ran nothing are left out)."""
    names: dict[Any, str] = {}
    labels: dict[Any, str] = {}
    device_pids: set[Any] = set()
    pids = list(dict.fromkeys(event.get("pid") for event in events if event.get("ph") != "M"))
    for event in events:
        pid = event.get("pid")
        if event.get("ph") == "M":
            args = event.get("args") or {}
            if event.get("name") == "process_name":
                names[pid] = str(args.get("name", ""))
            elif event.get("name") == "process_labels":
                labels[pid] = str(args.get("labels", ""))
        elif event.get("cat") in DEVICE_CATEGORIES:
            device_pids.add(pid)
    numbers = {pid for pid in pids if isinstance(pid, int)}
    synthetic = SYNTHETIC_PIDS
    out: dict[Any, dict[str, Any]] = {}
    for pid in pids:
        label = labels.get(pid, "")
        device = pid in device_pids or label.startswith("GPU")
        if isinstance(pid, int) and not device:
            number = pid
        else:
            while synthetic in numbers:
                synthetic += 1
            number, synthetic = synthetic, synthetic + 1
        name = label if device and label else names.get(pid) or f"process {pid}"
        out[pid] = {"pid": number, "name": name, "labels": label, "device": device}
    return out


def encode(events: list[dict[str, Any]], metadata: dict[str, Any] | None = None) -> bytes:
    """A Perfetto trace of Chrome-trace events (``metadata``: the trace's top-level keys)."""
    rank = ((metadata or {}).get("distributedInfo") or {}).get("rank")
    suffix = f" (rank {rank})" if rank is not None else ""
    processes = _processes(events)
    thread_names: dict[tuple[Any, Any], str] = {}
    slices: dict[tuple[Any, Any], list[_Slice]] = defaultdict(list)
    instants: list[dict[str, Any]] = []
    flow_ends: list[dict[str, Any]] = []
    for event in events:
        phase = event.get("ph")
        if phase == "M" and event.get("name") == "thread_name":
            name = str((event.get("args") or {}).get("name", "")).strip()
            thread_names[(event.get("pid"), event.get("tid"))] = name
        elif phase == "X" and "ts" in event:
            slices[(event.get("pid"), event.get("tid"))].append(_Slice(event))
        elif phase in ("i", "I") and "ts" in event:
            instants.append(event)
        elif phase in ("s", "f") and "ts" in event and "id" in event:
            flow_ends.append(event)

    descriptors: list[bytes] = [_packet(_int(PACKET_SEQUENCE_FLAGS, INCREMENTAL_STATE_CLEARED))]
    process_uuid: dict[Any, int] = {}
    for pid, process in processes.items():
        uuid = process_uuid[pid] = _uuid("p", pid)
        body = _int(PROCESS_PID, process["pid"]) + _str(PROCESS_NAME, process["name"] + suffix)
        if process["labels"]:
            body += _str(PROCESS_LABELS, process["labels"])
        descriptors.append(_packet(_bytes(PACKET_TRACK_DESCRIPTOR,
                                          _int(DESC_UUID, uuid) + _bytes(DESC_PROCESS, body))))

    timelines: list[list[tuple[int, int, bytes]]] = []  # per track: (ns, order, packet body)
    index: dict[tuple[Any, Any], list[tuple[int, int, _Slice]]] = {}
    tracks: dict[tuple[Any, Any], list[tuple[int, list[_Slice]]]] = {}
    for key in sorted(slices, key=str):
        pid, tid = key
        process = processes[pid]
        default = f"stream {tid}" if process["device"] else f"thread {tid}"
        name = thread_names.get(key) or default
        tracks[key] = []
        for level, members in enumerate(_nest(slices[key])):
            uuid = _uuid("t", pid, tid, level)
            desc = _int(DESC_UUID, uuid) + _int(DESC_PARENT, process_uuid[pid])
            desc += _str(DESC_NAME, name if level == 0 else f"{name} (overlap {level})")
            if level == 0 and not process["device"] and isinstance(tid, int):
                desc += _bytes(DESC_THREAD, _int(THREAD_PID, process["pid"])
                               + _int(THREAD_TID, tid) + _str(THREAD_NAME, name))
            descriptors.append(_packet(_bytes(PACKET_TRACK_DESCRIPTOR, desc)))
            for item in members:
                item.track = uuid
            tracks[key].append((uuid, members))
        index[key] = sorted(((s.start, s.end, s) for s in slices[key]), key=lambda x: x[:2])

    _bind_flows(flow_ends, index)
    for members_by_level in tracks.values():
        for uuid, members in members_by_level:
            timelines.append(_track_timeline(uuid, members))
    for event in instants:
        key = (event.get("pid"), event.get("tid"))
        uuid = tracks[key][0][0] if key in tracks else process_uuid.get(event.get("pid"), 0)
        body = _int(EVENT_TYPE, INSTANT) + _int(EVENT_TRACK, uuid)
        body += _str(EVENT_NAME, str(event.get("name", "")))
        timelines.append([(_ns(event["ts"]), 0, _bytes(PACKET_TRACK_EVENT, body))])

    out = descriptors
    ordered = heapq.merge(*[[(ns, track, order, body) for ns, order, body in timeline]
                            for track, timeline in enumerate(timelines)])
    out += [_packet(body, ns) for ns, _, _, body in ordered]
    return b"".join(out)


def _bind_flows(flow_ends: list[dict[str, Any]],
                index: dict[tuple[Any, Any], list[tuple[int, int, _Slice]]]) -> int:
    """Tie each flow's start ("s") and ends ("f") to the slices they sit in, as Chrome does
    (an end marked ``"bp": "e"`` binds to the enclosing slice, else to the next slice). A
    Kineto flow fans out (a graph launch: one start, an end per kernel), Perfetto's flows do
    not: each (start, end) pair becomes a flow of its own. Ends whose start or slice cannot be
    found are left out. Returns how many flows were kept."""

    def bind(event: dict[str, Any]) -> _Slice | None:
        slices = index.get((event.get("pid"), event.get("tid")))
        if not slices:
            return None
        ts = _ns(event["ts"])
        if event.get("ph") == "s" or event.get("bp") == "e":
            return _enclosing(slices, ts)
        position = bisect.bisect_left(slices, (ts, -1))  # the next slice at or after ts
        return slices[position][2] if position < len(slices) else None

    starts = {(e.get("cat"), e.get("id")): bind(e) for e in flow_ends if e.get("ph") == "s"}
    kept = 0
    for event in flow_ends:
        flow = (event.get("cat"), event.get("id"))
        start = starts.get(flow)
        if event.get("ph") != "f" or start is None:
            continue
        end = bind(event)
        if end is None:
            continue
        flow_id = _uuid("flow", *flow, kept)
        start.flows_out.append(flow_id)
        end.flows_in.append(flow_id)
        kept += 1
    return kept


def _track_timeline(uuid: int, members: list[_Slice]) -> list[tuple[int, int, bytes]]:
    """The begin and end packets of one track's (nested) slices, in order."""
    timeline: list[tuple[int, int, bytes]] = []
    stack: list[_Slice] = []

    def close_until(ts: int) -> None:
        while stack and stack[-1].end <= ts:
            item = stack.pop()
            end = _int(EVENT_TYPE, SLICE_END) + _int(EVENT_TRACK, uuid)
            timeline.append((item.end, len(timeline), _bytes(PACKET_TRACK_EVENT, end)))

    for item in sorted(members, key=lambda s: (s.start, -s.end)):
        close_until(item.start)
        event = item.event
        begin = _int(EVENT_TYPE, SLICE_BEGIN) + _int(EVENT_TRACK, uuid)
        begin += _str(EVENT_NAME, str(event.get("name", "")))
        if event.get("cat"):
            begin += _str(EVENT_CATEGORIES, str(event["cat"]))
        for key, value in (event.get("args") or {}).items():
            begin += _annotation(str(key), value)
        for flow_id in item.flows_out:
            begin += _fixed64(EVENT_FLOW_IDS, flow_id)
        for flow_id in item.flows_in:
            begin += _fixed64(EVENT_TERMINATING_FLOW_IDS, flow_id)
        timeline.append((item.start, len(timeline), _bytes(PACKET_TRACK_EVENT, begin)))
        stack.append(item)
    close_until(1 << 62)
    return timeline


def write(events: list[dict[str, Any]], path: Path, metadata: dict[str, Any] | None = None
          ) -> None:
    """Write Chrome-trace events as a Perfetto trace at ``path`` (atomically)."""
    from autoannot.traces.files import atomic_write_bytes

    atomic_write_bytes(path, encode(events, metadata))

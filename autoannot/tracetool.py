"""Merge the agent's annotations into Kineto traces: graphed NCCL kernels get the eager args.

Two sources, per kernel:

* torch's toolsId path: kernels that carry a ``"graph node id"`` are looked up in the ledger
  file's ``tools_id`` map (what ``mark_kernels`` recorded);
* the fallback, which needs no toolsId: each ``cudaGraphLaunch`` inside an
  ``autoannot.replay:<graph>`` range launched that graph; its NCCL kernels (they share the
  launch's correlation id) are matched, by start time, to the graph's ledger — the collectives
  in capture order — keeping each process group's order and checking each kernel's family
  (``ncclDevKernel_AllReduce...`` against an all_reduce, ...). A kernel that fits no ledger
  entry is reported, never guessed; when the next collectives of two groups share a family,
  capture order decides and the report counts it as ``order_resolved``.

Annotated kernels get the eager kernel's keys with their JSON types and move to their process
group's lane (``"stream"`` >= 60, named after the group). Traces in Kineto's own layout are
rewritten event by event without parsing the events that do not change; others are parsed
whole.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from autoannot import export
from autoannot import vocabulary as V
from autoannot.capture import REPLAY_PREFIX


class TraceError(Exception):
    """A trace or ledger that cannot be used; the message names the file and the problem."""


# --- reading and writing ---------------------------------------------------------------------

_EVENTS_KEY = '"traceEvents": ['
_SEPARATOR = "\n  },\n  {\n"  # Kineto writes one event per "  {...}" block


def read_text(path: Path) -> str:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return f.read()
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None


def write_text(path: Path, text: str) -> None:
    """Write atomically (temporary file, then rename); gzip for ``.gz`` names."""
    data = text.encode("utf-8")
    if path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=3, mtime=0)
    export.atomic_write_bytes(path, data)


class Trace:
    """A trace read in two streaming passes when it has Kineto's layout (one event per
    ``"  {...}"`` block): the first parses only the events the caller wants, the second copies
    every other event's text unchanged. Other layouts are parsed whole."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: dict[int, Event] = {}  # the scanned events, by index
        self.added: list[dict[str, Any]] = []  # events to append
        self.document: dict[str, Any] | None = None
        self.head = self._read_head()
        if self.head is None:  # not Kineto's layout: parse it whole
            self.document = self._parse_whole()

    def _open(self) -> Any:
        if self.path.name.endswith(".gz"):
            return gzip.open(self.path, "rt", encoding="utf-8")
        return open(self.path, encoding="utf-8")

    def _read_head(self) -> str | None:
        """The text before the first event, if the trace has Kineto's layout."""
        if not self.path.is_file():
            raise TraceError(f"{self.path}: no such file")
        try:
            with self._open() as f:
                start = f.read(1 << 16)
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise TraceError(f"{self.path}: cannot read: {exc}") from None
        key = start.find(_EVENTS_KEY)
        opening = key + len(_EVENTS_KEY)
        if key < 0 or not start.startswith("\n  {\n", opening):
            return None
        return start[: opening + len("\n  {\n")]

    def _parse_whole(self) -> dict[str, Any]:
        try:
            with self._open() as f:
                doc = json.load(f)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{self.path}: not valid JSON ({exc.msg} at line {exc.lineno}); "
                             "truncated?") from None
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise TraceError(f"{self.path}: cannot read: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            raise TraceError(f"{self.path}: no traceEvents list: not a Kineto/Chrome trace")
        return doc

    def _blocks(self) -> Iterator[list[str]]:
        """The events' texts (without their braces), a few MiB at a time; then ``self.tail``
        is set."""
        assert self.head is not None
        try:
            with self._open() as f:
                f.read(len(self.head))
                pending, eof = "", False
                while not eof:
                    block = f.read(_BLOCK)
                    eof = not block
                    parts = (pending + block).split(_SEPARATOR)
                    pending = parts.pop()
                    if parts:
                        yield parts
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise TraceError(f"{self.path}: cannot read: {exc}") from None
        end = pending.rfind(_CLOSING)
        if end < 0 or not pending.rstrip().endswith("}"):
            raise TraceError(f"{self.path}: the event list is not closed: truncated trace?")
        self.tail = pending[end:]
        yield [pending[:end]]

    def _chunks(self) -> Iterator[str]:
        for block in self._blocks():
            yield from block

    def scan(self, wanted: Callable[[str], bool]) -> Iterator[int]:
        """Parse and yield the events ``wanted`` accepts (given each event's raw text); every
        event when the trace was parsed whole."""
        if self.document is not None:
            for index, event in enumerate(self.document["traceEvents"]):
                if isinstance(event, dict):
                    self.events[index] = Event.of(event)
                    yield index
            return
        for index, chunk in enumerate(self._chunks()):
            if wanted(chunk):
                try:
                    self.events[index] = Event.parse(chunk)
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{self.path}: event {index} is not valid JSON "
                                     f"({exc.msg})") from None
                yield index

    def event(self, index: int) -> Event:
        return self.events[index]

    def metadata(self) -> dict[str, Any]:
        """The document's top-level keys other than the events (``distributedInfo``, ...)."""
        if self.document is not None:
            return {k: v for k, v in self.document.items() if k != "traceEvents"}
        try:
            return json.loads(self.head[: self.head.rfind(_EVENTS_KEY)].rstrip().rstrip(",")
                              + "\n}")
        except json.JSONDecodeError:
            return {}

    def all_events(self, patches: Patches) -> list[dict[str, Any]]:
        """Every event, parsed and patched (for formats that need them all)."""
        if self.document is not None:
            events = self.document["traceEvents"]
        else:
            events = [json.loads("{" + chunk + "}") for chunk in self._chunks()]
        return [patches.apply_to_event(i, e) if i in patches else e
                for i, e in enumerate(events)] + self.added

    def write(self, output: Path, patches: Patches) -> None:
        """Write the patched trace and the added events, atomically; streaming when the trace
        has Kineto's layout (unchanged events are copied as text)."""
        if self.document is not None:
            events = self.document["traceEvents"]
            for index in list(patches.kernels) + list(patches.flows):
                patches.apply_to_event(index, events[index])
            events.extend(self.added)
            write_text(output, json.dumps(self.document))
            return
        with _AtomicOutput(output) as out:
            out.write(self.head)
            index = 0
            for block in self._blocks():
                if index:
                    out.write(_SEPARATOR)
                for i in patches.indices_between(index, index + len(block)):
                    block[i - index] = patches.apply_to_text(i, block[i - index])
                out.write(_SEPARATOR.join(block))
                index += len(block)
            for event in self.added:
                out.write(_SEPARATOR)
                out.write(_dump_event(event))
            out.write(self.tail)


_BLOCK = 1 << 20
# Kineto's text of an "X" event: "ph", "cat", "name", "pid", "tid", then "ts", "dur".
_HEAD = re.compile(r'^\s*"ph": "X", "cat": "(kernel|cuda_runtime|user_annotation)", '
                   r'"name": "([^"\\]*)", "pid": ([^,]+), "tid": ([^,]+),\s*'
                   r'"ts": ([-0-9.e+]+), "dur": ([-0-9.e+]+)')
_CORRELATION = re.compile(r'"correlation": (-?\d+)')
_NODE = re.compile(r'"graph node id": (\d+)')


def _number(text: str) -> Any:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return json.loads(text)


class Event(NamedTuple):
    """What matching reads of an event (the event's text is what gets written)."""

    cat: Any
    ph: Any
    name: str
    pid: Any
    tid: Any
    ts: float
    dur: float
    correlation: Any
    node: Any  # "graph node id"
    label: Any  # args "name" (thread names)

    @staticmethod
    def parse(chunk: str) -> Event:
        """From Kineto's text of a kernel or runtime event: a regex where it fits, else JSON."""
        head = _HEAD.match(chunk)
        if head is not None:
            cat, name, pid, tid, ts, dur = head.groups()
            correlation = _CORRELATION.search(chunk)
            node = _NODE.search(chunk)
            pid = int(pid) if pid.isdigit() else _number(pid)
            tid = int(tid) if tid.isdigit() else _number(tid)
            return Event(cat, "X", sys.intern(name), pid, tid, float(ts),
                         float(dur), int(correlation.group(1)) if correlation else None,
                         int(node.group(1)) if node else None, None)
        return Event.of(json.loads("{" + chunk + "}"))

    @staticmethod
    def of(event: dict[str, Any]) -> Event:
        args = event.get("args") or {}
        return Event(event.get("cat"), event.get("ph"), sys.intern(str(event.get("name", ""))),
                     event.get("pid"), event.get("tid"), float(event.get("ts", 0)),
                     float(event.get("dur", 0)), args.get("correlation"),
                     args.get("graph node id"), args.get("name"))
_CLOSING = "\n  }\n  ]"


class _AtomicOutput:
    """A text file written to a temporary name and renamed into place on success."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> Any:
        import tempfile

        fd, self.tmp = tempfile.mkstemp(prefix=".autoannot-", dir=self.path.parent)
        raw = os.fdopen(fd, "wb")
        if self.path.name.endswith(".gz"):
            self.stream = gzip.open(raw, "wt", encoding="utf-8", compresslevel=3)
            self.raw = raw
        else:
            self.stream = open(fd, "w", encoding="utf-8", closefd=False)
            self.raw = raw
        return self.stream

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.stream.close()
            self.raw.close()
            if exc_type is None:
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(self.tmp, 0o666 & ~umask)
                os.replace(self.tmp, self.path)
        finally:
            if os.path.exists(self.tmp):
                os.unlink(self.tmp)


def _dump_event(event: dict[str, Any]) -> str:
    text = json.dumps(event, separators=(", ", ": "))
    return "    " + text[1:-1]


# --- matching --------------------------------------------------------------------------------

_FAMILY = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")


def kernel_family(name: str) -> str | None:
    """``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` -> ``"AllReduce"``; None if not NCCL."""
    match = _FAMILY.match(name)
    return match.group(1) if match else None


@dataclass
class Report:
    """What annotating one trace did."""

    trace: str
    graph_launches: int = 0  # cudaGraphLaunch events seen
    launches_of_known_graphs: int = 0  # ... inside an autoannot.replay range with a ledger
    kernels_expected: int = 0  # NCCL kernels of those launches
    kernels_annotated: int = 0
    by_tools_id: int = 0  # of which through torch's toolsId map
    order_resolved: int = 0  # matched by capture order between groups of the same family
    mismatches: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _wanted(chunk: str) -> bool:
    """Cheap first look at an event's text: might matching need it? (``annotate`` decides.)"""
    return "nccl" in chunk or "GraphLaunch" in chunk or REPLAY_PREFIX in chunk or (
        '"thread_name"' in chunk)


def load_ledger(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TraceError(f"{path}: no such ledger file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: not a readable autoannot ledger ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != export.FORMAT:
        raise TraceError(f"{path}: not an autoannot ledger (no \"format\": \"{export.FORMAT}\")")
    return document


class Patches:
    """What annotating changes: kernel index -> (annotation, lane); flow index -> lane."""

    def __init__(self) -> None:
        self.kernels: dict[int, tuple[dict[str, Any], Any]] = {}
        self.flows: dict[int, Any] = {}
        # Kineto writes a kernel's flow-end event right after it: index -> (lane, kernel ts)
        self.maybe_flows: dict[int, tuple[Any, float]] = {}
        self._texts: dict[int, str] = {}  # id(annotation) -> its args, as JSON text
        self._sorted: list[int] | None = None

    def apply_to_event(self, index: int, event: dict[str, Any]) -> dict[str, Any]:
        if index in self.kernels:
            annotation, lane = self.kernels[index]
            args = event.setdefault("args", {})
            for key, value in annotation.items():
                if key not in (V.NAME, V.STREAM):
                    args[key] = value
            if lane is not None:
                event["tid"] = lane
                args["stream"] = lane
        elif index in self.flows:
            event["tid"] = self.flows[index]
        return event

    def apply_to_text(self, index: int, chunk: str) -> str:
        """Patch an event's Kineto text in place of parsing and re-dumping it."""
        if index in self.kernels:
            annotation, lane = self.kernels[index]
            text = self._texts.get(id(annotation))
            if text is None:
                pairs = {k: v for k, v in annotation.items() if k not in (V.NAME, V.STREAM)}
                text = self._texts[id(annotation)] = json.dumps(pairs)[1:-1]
            body = chunk.rstrip()
            if not body.endswith("}") or '"Collective name"' in chunk:  # unusual: go slow
                return _dump_event(self.apply_to_event(index, json.loads("{" + chunk + "}")))
            close = body.rfind("}")
            inner = body[:close].rstrip()
            body = inner + ("" if inner.endswith("{") else ",") + " " + text + " " + body[close:]
            if lane is not None:
                body = _TID.sub(f'"tid": {lane}', body, count=1)
                body = _STREAM.sub(f'"stream": {lane}', body, count=1)
            return body
        if index in self.flows:
            return _TID.sub(f'"tid": {self.flows[index]}', chunk, count=1)
        if index in self.maybe_flows and '"ac2g"' in chunk and '"ph": "f"' in chunk:
            lane, ts = self.maybe_flows[index]
            found = _TS.search(chunk)
            if found is not None and float(found.group(1)) == ts:
                return _TID.sub(f'"tid": {lane}', chunk, count=1)
        return chunk

    def __contains__(self, index: int) -> bool:
        return index in self.kernels or index in self.flows

    def indices_between(self, start: int, stop: int) -> list[int]:
        """The patched indices in ``[start, stop)``, in order."""
        if self._sorted is None:
            self._sorted = sorted({*self.kernels, *self.flows, *self.maybe_flows})
        low = bisect.bisect_left(self._sorted, start)
        high = bisect.bisect_left(self._sorted, stop)
        return self._sorted[low:high]


_TID = re.compile(r'"tid": [^,\n}]+')
_STREAM = re.compile(r'"stream": -?\d+')
_TS = re.compile(r'"ts": ([-0-9.e+]+)')


def annotate(trace: Trace, ledger: dict[str, Any]) -> tuple[Report, Patches]:
    """Annotate ``trace`` with ``ledger``; returns the report and the patches to write."""
    report = Report(str(trace.path))
    graphs: dict[str, list[dict]] = ledger.get("graphs") or {}
    tools_id = {int(k): v for k, v in (ledger.get("tools_id") or {}).items()}
    rank = ledger.get("rank")
    trace_rank = trace.metadata().get("distributedInfo", {}).get("rank")
    if rank is not None and trace_rank is not None and rank != trace_rank:
        raise TraceError(f"{trace.path}: the ledger is rank {rank}'s, the trace rank "
                         f"{trace_rank}'s: they do not belong together")

    launches: list[tuple[float, Any, Any, int]] = []  # (ts, pid, tid, correlation)
    markers: dict[tuple[Any, Any], list[tuple[float, float, str]]] = defaultdict(list)
    kernels: dict[int, list[int]] = defaultdict(list)  # correlation -> NCCL kernel indices
    flows: dict[tuple[Any, Any], list[int]] = defaultdict(list)  # (tid, ts) -> ac2g "f" events
    named_tids: set[tuple[Any, Any]] = set()
    by_node: list[int] = []
    for i in trace.scan(_wanted):
        event = trace.event(i)
        cat, name = event.cat, event.name
        if cat == "kernel" and kernel_family(name):
            if event.node:
                by_node.append(i)
            kernels[event.correlation].append(i)
        elif cat == "cuda_runtime" and name.startswith(("cudaGraphLaunch", "cuGraphLaunch")):
            report.graph_launches += 1
            launches.append((event.ts, event.pid, event.tid, event.correlation))
        elif cat == "user_annotation" and name.startswith(REPLAY_PREFIX):
            markers[(event.pid, event.tid)].append(
                (event.ts, event.ts + event.dur, name[len(REPLAY_PREFIX):]))
        elif cat == "ac2g" and event.ph == "f":
            flows[(event.tid, event.ts)].append(i)
        elif event.ph == "M" and name == "thread_name":
            named_tids.add((event.pid, event.tid))

    patches = Patches()
    lanes: dict[Any, tuple[Any, str]] = {}
    streamed = trace.document is None

    def apply(index: int, annotation: dict[str, Any]) -> None:
        event = trace.event(index)
        lane = annotation.get(V.STREAM)
        patches.kernels[index] = (annotation, lane)
        if lane is not None:
            if streamed:
                patches.maybe_flows[index + 1] = (lane, event.ts)
            else:
                for flow in flows.get((event.tid, event.ts), ()):
                    patches.flows[flow] = lane
            if lane not in lanes:
                lanes[lane] = (event.pid, _lane_name(annotation))
        report.kernels_annotated += 1

    for index in by_node:  # torch's toolsId path
        entry = tools_id.get(int(trace.event(index).node))
        if entry:
            merged: dict[str, Any] = {}
            for annotation in entry:
                if isinstance(annotation, dict):
                    merged.update(annotation)
            apply(index, merged)
            report.by_tools_id += 1

    for marker_list in markers.values():
        marker_list.sort()
    ledgers: dict[str, _Ledger] = {}
    for ts, pid, tid, correlation in sorted(launches, key=lambda launch: launch[0]):
        graph = _enclosing(markers.get((pid, tid), []), ts)
        entries = graphs.get(graph) if graph is not None else None
        if entries is None:
            continue
        if graph not in ledgers:
            ledgers[graph] = _Ledger(entries)
        report.launches_of_known_graphs += 1
        ordered = sorted(kernels.get(correlation, []), key=lambda i: trace.event(i).ts)
        todo = [i for i in ordered if i not in patches.kernels]
        report.kernels_expected += len(ordered)
        _match(trace, graph, correlation, todo, ledgers[graph], apply, report)

    for lane, (pid, name) in sorted(lanes.items(), key=lambda item: item[0]):
        if (pid, lane) not in named_tids:
            trace.added.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": lane,
                                "args": {"name": name}})
            trace.added.append({"name": "thread_sort_index", "ph": "M", "pid": pid,
                                "tid": lane, "args": {"sort_index": lane}})
    return report, patches


def _lane_name(annotation: dict[str, Any]) -> str:
    group = annotation.get(V.PG_DESC) or "group"
    return f"nccl {group} (pg {annotation.get(V.PG_NAME, '?')})"


def _enclosing(markers: list[tuple[float, float, str]], ts: float) -> str | None:
    """The innermost replay range that contains ``ts`` (``markers`` sorted by start)."""
    position = bisect.bisect_right(markers, (ts, float("inf"), "\uffff"))
    for i in range(position - 1, max(-1, position - 65), -1):  # ranges nest only so deep
        start, end, graph = markers[i]
        if start <= ts <= end:
            return graph
    return None


#: CUPTI timestamps of back-to-back kernels can overlap by a little; more than this is real.
OVERLAP_TOLERANCE_US = 1.0
_SEARCH_LIMIT = 100_000


class _Ledger:
    """One graph's captured collectives, grouped by process group (lane), in capture order."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        lanes: dict[Any, list[tuple[int, frozenset[str], dict[str, Any]]]] = {}
        for position, entry in enumerate(entries):
            lane = entry["annotation"].get(V.STREAM)
            kinds = frozenset(entry.get("kernels") or ())
            lanes.setdefault(lane, []).append((position, kinds, entry["annotation"]))
        self.lanes = list(lanes.values())
        self.size = len(entries)
        self.apis = [entry.get("api", "?") for entry in entries]


def _match(trace: Trace, graph: str, correlation: Any, kernels: list[int], ledger: _Ledger,
           apply: Callable[[int, dict], None], report: Report) -> None:
    """Assign a graph's captured collectives to one replay's NCCL kernels.

    The kernels, in start order, each take the next collective of a process group whose
    kernel family fits and whose previous kernel has ended (one group's collectives run one
    after another); among several, the one captured first. Where that greedy walk gets stuck,
    a depth-first search tries the other choices. Kernels that had a choice are counted as
    ``order_resolved``; a replay no assignment fits is reported.
    """
    events = [trace.event(i) for i in kernels]
    families = [kernel_family(e.name) for e in events]
    starts = [e.ts + OVERLAP_TOLERANCE_US for e in events]
    ends = [e.ts + e.dur for e in events]
    if len(kernels) != ledger.size:
        report.mismatches.append(
            f"{graph} (correlation {correlation}): {len(kernels)} NCCL kernels for "
            f"{ledger.size} captured collectives")
        return
    lanes = ledger.lanes
    head = [0] * len(lanes)
    lane_end = [float("-inf")] * len(lanes)

    def candidates(k: int) -> list[tuple[int, int]]:
        family, start, fits = families[k], starts[k], []
        for li, queue in enumerate(lanes):
            h = head[li]
            if h < len(queue) and start >= lane_end[li]:
                position, kinds, _ = queue[h]
                if not kinds or family in kinds:
                    fits.append((position, li))
        return fits

    chosen: list[int] = []
    choices = 0
    for k in range(len(kernels)):  # the greedy walk
        fits = candidates(k)
        if not fits:
            break
        if len(fits) > 1:
            choices += 1
        li = min(fits)[1]
        chosen.append(li)
        head[li] += 1
        lane_end[li] = ends[k]
    if len(chosen) < len(kernels):  # stuck: search the other choices
        chosen, head[:], lane_end[:] = [], [0] * len(lanes), [float("-inf")] * len(lanes)
        steps, deepest = [0], [0]

        def search(k: int) -> bool:
            steps[0] += 1
            if k == len(kernels):
                return True
            if steps[0] > _SEARCH_LIMIT:
                return False
            deepest[0] = max(deepest[0], k)
            for _, li in sorted(candidates(k)):
                saved = lane_end[li]
                head[li] += 1
                lane_end[li] = ends[k]
                chosen.append(li)
                if search(k + 1):
                    return True
                chosen.pop()
                head[li] -= 1
                lane_end[li] = saved
            return False

        if not search(0):
            k = deepest[0]
            left = sorted({ledger.apis[q[h][0]] for q, h in zip(lanes, head, strict=True)
                           if h < len(q)})
            report.mismatches.append(
                f"{graph} (correlation {correlation}): no assignment fits NCCL kernel {k} "
                f"({families[k]}); captured collectives left: {', '.join(left) or 'none'}")
            return
        choices = 0
        head[:], lane_end[:] = [0] * len(lanes), [float("-inf")] * len(lanes)
        for k, li in enumerate(chosen):
            choices += len(candidates(k)) > 1
            head[li] += 1
            lane_end[li] = ends[k]
    report.order_resolved += choices
    taken = [0] * len(lanes)
    for k, li in enumerate(chosen):
        apply(kernels[k], lanes[li][taken[li]][2])
        taken[li] += 1


# --- files -----------------------------------------------------------------------------------

def default_output(trace_path: Path) -> Path:
    name = trace_path.name
    for ending in (".json.gz", ".json"):
        if name.endswith(ending):
            return trace_path.with_name(name[: -len(ending)] + ".annotated" + ending)
    return trace_path.with_name(name + ".annotated.json")


def annotate_file(trace_path: str | os.PathLike[str], output: str | os.PathLike[str],
                  ledger_path: str | os.PathLike[str] | None = None) -> Report:
    """Annotate one trace file with its ledger (found next to it unless given); write ``output``
    (``.json``, ``.json.gz`` or ``.pftrace``)."""
    trace_path, output = Path(trace_path), Path(output)
    if not trace_path.is_file():
        raise TraceError(f"{trace_path}: no such file")
    ledger_file = Path(ledger_path) if ledger_path else Path(export.ledger_path(trace_path))
    if not ledger_file.exists():
        raise TraceError(f"{trace_path}: no ledger {ledger_file.name} next to it (was the agent "
                         "on when the trace was exported? pass --ledger)")
    ledger = load_ledger(ledger_file)
    trace = Trace(trace_path)
    report, patches = annotate(trace, ledger)
    if output.suffix == ".pftrace":
        from autoannot import perfetto

        perfetto.write(trace.all_events(patches), output)
    else:
        trace.write(output, patches)
    return report

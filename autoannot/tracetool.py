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
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    """A trace as a list of events, each parsed lazily when Kineto's layout allows it."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self._split = self._split_kineto(text)
        if self._split is None:  # not Kineto's layout: parse it whole
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(
                    f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
                raise TraceError(f"{path}: no traceEvents list: not a Kineto/Chrome trace")
            self.document: dict[str, Any] | None = doc
            self.chunks: list[str] = []
            self.events: list[Any] = doc["traceEvents"]
        else:
            self.document = None
            head, self.chunks, self.tail = self._split
            self.head = head
            self.events = [None] * len(self.chunks)
        self.added: list[dict[str, Any]] = []

    @staticmethod
    def _split_kineto(text: str) -> tuple[str, list[str], str] | None:
        start = text.find(_EVENTS_KEY)
        if start < 0:
            return None
        body_start = start + len(_EVENTS_KEY)
        end = text.rfind("\n  }\n  ]")
        if not text.startswith("\n  {\n", body_start) or end < body_start:
            return None
        head = text[: body_start + len("\n  {\n")]
        tail = text[end:]  # "\n  }\n  ]...": closes the last event, the list, the document
        body = text[body_start + len("\n  {\n") : end]
        chunks = body.split(_SEPARATOR) if body else []
        # The tail must close the list and the document: else this is not Kineto's layout.
        if not tail.startswith("\n  }\n  ]") or not tail.rstrip().endswith("}"):
            return None
        return head, chunks, tail

    def event(self, index: int) -> dict[str, Any]:
        """The parsed event at ``index`` (parsed on first use)."""
        event = self.events[index]
        if event is None:
            try:
                event = json.loads("{" + self.chunks[index] + "}")
            except json.JSONDecodeError as exc:
                raise TraceError(
                    f"{self.path}: event {index} is not valid JSON ({exc.msg})") from None
            self.events[index] = event
        return event

    def scan(self, wanted: Callable[[str], bool]) -> Iterator[int]:
        """Indices of events worth parsing: ``wanted`` sees each raw chunk (Kineto layout) or
        each event's JSON (other layouts)."""
        if self.document is not None:
            for i in range(len(self.events)):
                yield i
            return
        for i, chunk in enumerate(self.chunks):
            if wanted(chunk):
                yield i

    def metadata(self) -> dict[str, Any]:
        """The document's top-level keys other than the events (``distributedInfo``, ...)."""
        if self.document is not None:
            return {k: v for k, v in self.document.items() if k != "traceEvents"}
        try:
            return json.loads(self.head[: self.head.rfind(_EVENTS_KEY)].rstrip().rstrip(",")
                              + "\n}")
        except json.JSONDecodeError:
            return {}

    def render(self, changed: set[int]) -> str:
        if self.document is not None:
            self.document["traceEvents"].extend(self.added)
            return json.dumps(self.document)
        chunks = self.chunks
        for i in changed:
            chunks[i] = _dump_event(self.events[i])
        for event in self.added:
            chunks.append(_dump_event(event))
        return self.head + _SEPARATOR.join(chunks) + self.tail


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
    return ('"cat": "kernel"' in chunk and "nccl" in chunk) or "cudaGraphLaunch" in chunk or (
        REPLAY_PREFIX in chunk) or '"cat": "ac2g"' in chunk or '"thread_name"' in chunk


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


def annotate(trace: Trace, ledger: dict[str, Any]) -> tuple[Report, set[int]]:
    """Annotate ``trace`` in memory with ``ledger``; returns the report and the changed events."""
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
        cat, name = event.get("cat"), event.get("name", "")
        if cat == "kernel" and kernel_family(name):
            args = event.get("args", {})
            if args.get("graph node id"):
                by_node.append(i)
            kernels[args.get("correlation")].append(i)
        elif cat == "cuda_runtime" and name.startswith(("cudaGraphLaunch", "cuGraphLaunch")):
            report.graph_launches += 1
            launches.append((event["ts"], event.get("pid"), event.get("tid"),
                             event.get("args", {}).get("correlation")))
        elif cat == "user_annotation" and name.startswith(REPLAY_PREFIX):
            markers[(event.get("pid"), event.get("tid"))].append(
                (event["ts"], event["ts"] + event.get("dur", 0), name[len(REPLAY_PREFIX):]))
        elif cat == "ac2g" and event.get("ph") == "f":
            flows[(event.get("tid"), event.get("ts"))].append(i)
        elif event.get("ph") == "M" and name == "thread_name":
            named_tids.add((event.get("pid"), event.get("tid")))

    changed: set[int] = set()
    lanes: dict[Any, tuple[Any, str]] = {}

    def apply(index: int, annotation: dict[str, Any]) -> None:
        event = trace.event(index)
        args = event.setdefault("args", {})
        for key, value in annotation.items():
            if key not in (V.NAME, V.STREAM):
                args[key] = value
        lane = annotation.get(V.STREAM)
        if lane is not None:
            for flow in flows.get((event.get("tid"), event.get("ts")), ()):
                trace.event(flow)["tid"] = lane
                changed.add(flow)
            event["tid"] = lane
            args["stream"] = lane
            lanes[lane] = (event.get("pid"), _lane_name(annotation))
        changed.add(index)
        report.kernels_annotated += 1

    for index in by_node:  # torch's toolsId path
        entry = tools_id.get(int(trace.event(index)["args"]["graph node id"]))
        if entry:
            merged: dict[str, Any] = {}
            for annotation in entry:
                if isinstance(annotation, dict):
                    merged.update(annotation)
            apply(index, merged)
            report.by_tools_id += 1

    for marker_list in markers.values():
        marker_list.sort()
    for ts, pid, tid, correlation in sorted(launches, key=lambda launch: launch[0]):
        graph = _enclosing(markers.get((pid, tid), []), ts)
        entries = graphs.get(graph) if graph is not None else None
        if entries is None:
            continue
        report.launches_of_known_graphs += 1
        ordered = sorted(kernels.get(correlation, []), key=lambda i: trace.event(i)["ts"])
        todo = [i for i in ordered if i not in changed]
        report.kernels_expected += len(ordered)
        _match(trace, graph, correlation, todo, entries, apply, report)

    for lane, (pid, name) in sorted(lanes.items(), key=lambda item: item[0]):
        if (pid, lane) not in named_tids:
            trace.added.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": lane,
                                "args": {"name": name}})
            trace.added.append({"name": "thread_sort_index", "ph": "M", "pid": pid,
                                "tid": lane, "args": {"sort_index": lane}})
    return report, changed


def _lane_name(annotation: dict[str, Any]) -> str:
    group = annotation.get(V.PG_DESC) or "group"
    return f"nccl {group} (pg {annotation.get(V.PG_NAME, '?')})"


def _enclosing(markers: list[tuple[float, float, str]], ts: float) -> str | None:
    """The innermost replay range that contains ``ts``."""
    position = bisect.bisect_right(markers, (ts, float("inf"), "\uffff"))
    for start, end, graph in reversed(markers[:position]):
        if start <= ts <= end:
            return graph
    return None


#: CUPTI timestamps of back-to-back kernels can overlap by a little; more than this is real.
OVERLAP_TOLERANCE_US = 1.0
_SEARCH_LIMIT = 100_000


def _match(trace: Trace, graph: str, correlation: Any, kernels: list[int],
           entries: list[dict[str, Any]], apply: Callable[[int, dict], None],
           report: Report) -> None:
    """Assign the ledger's entries to one replay's NCCL kernels (see the module docstring).

    A depth-first search over the kernels in start order: a kernel takes the next entry of a
    process group whose kernel family fits and whose previous kernel has ended (one group's
    collectives run one after another). Candidates are tried in capture order; the first
    complete assignment wins; the kernels that had more than one candidate on its path are
    counted as ``order_resolved``.
    """
    lanes: dict[Any, list[tuple[int, dict]]] = defaultdict(list)
    for position, entry in enumerate(entries):
        lanes[entry["annotation"].get(V.STREAM)].append((position, entry))
    events = [trace.event(i) for i in kernels]
    families = [kernel_family(e["name"]) for e in events]
    starts = [float(e["ts"]) for e in events]
    ends = [float(e["ts"]) + float(e.get("dur", 0)) for e in events]
    if len(kernels) != len(entries):
        report.mismatches.append(
            f"{graph} (correlation {correlation}): {len(kernels)} NCCL kernels for "
            f"{len(entries)} captured collectives")
        return
    head = dict.fromkeys(lanes, 0)
    lane_end = dict.fromkeys(lanes, float("-inf"))
    chosen: list[Any] = []
    steps = [0]
    deepest = [0]

    def candidates(k: int) -> list[Any]:
        fits = []
        for lane, queue in lanes.items():
            if head[lane] < len(queue):
                position, entry = queue[head[lane]]
                kinds = entry.get("kernels")
                if (not kinds or families[k] in kinds) and (
                        starts[k] >= lane_end[lane] - OVERLAP_TOLERANCE_US):
                    fits.append((position, lane))
        fits.sort()
        return fits

    def search(k: int) -> bool:
        steps[0] += 1
        if k == len(kernels):
            return True
        if steps[0] > _SEARCH_LIMIT:
            return False
        deepest[0] = max(deepest[0], k)
        for _, lane in candidates(k):
            saved = lane_end[lane]
            head[lane] += 1
            lane_end[lane] = ends[k]
            chosen.append(lane)
            if search(k + 1):
                return True
            chosen.pop()
            head[lane] -= 1
            lane_end[lane] = saved
        return False

    if not search(0):
        k = deepest[0]
        expected = sorted({queue[head[lane]][1]["api"] for lane, queue in lanes.items()
                           if head[lane] < len(queue)})
        report.mismatches.append(
            f"{graph} (correlation {correlation}): no assignment fits NCCL kernel {k} "
            f"({families[k]}); captured collectives left: {', '.join(expected) or 'none'}")
        return
    head.update(dict.fromkeys(lanes, 0))  # walk the assignment found, counting the choices
    lane_end.update(dict.fromkeys(lanes, float("-inf")))
    for k, lane in enumerate(chosen):
        if len(candidates(k)) > 1:
            report.order_resolved += 1
        apply(kernels[k], lanes[lane][head[lane]][1]["annotation"])
        head[lane] += 1
        lane_end[lane] = ends[k]


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
    trace = Trace(trace_path, read_text(trace_path))
    report, changed = annotate(trace, ledger)
    if output.suffix == ".pftrace":
        from autoannot import perfetto

        perfetto.write(trace, output)
    else:
        write_text(output, trace.render(changed))
    return report

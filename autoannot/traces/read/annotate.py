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

Annotated kernels get the eager kernel's keys with their JSON types, and stay where they ran:
their real stream (``tid`` and ``args.stream``), flows and replay markers are untouched, so
what analysis tools compute from streams (critical paths, idle time, user-annotation
attribution) is what it was. ``lanes=True`` moves each to its process group's lane instead
(``"stream"`` of the annotation, >= 60, named after the group), as torch's own tool does: one
row per group in a viewer, at the price of those stream-based analyses. Traces in Kineto's own
layout are rewritten event by event without parsing the events that do not change; others are
parsed whole.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoannot.describe import vocabulary as V
from autoannot.describe.collectives import SYMM_MEM_FAMILIES
from autoannot.traces.files import Trace, TraceError, dump_event
from autoannot.traces.read import ledger as ledgers
from autoannot.traces.read.ledger import REPLAY_PREFIX

# --- matching --------------------------------------------------------------------------------

_FAMILY = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
# torch's symmetric-memory kernels: ``void ...::one_shot_all_reduce_kernel<float, 16, 2>(...)``
_SYMM_MEM_FAMILY = re.compile(
    r"\b(" + "|".join(SYMM_MEM_FAMILIES) + r")_kernel(?:_inplace)?<")


_SYMM_MEM_MARKERS = tuple(f"{family}_kernel" for family in SYMM_MEM_FAMILIES)


def may_name_a_collective_kernel(text: str) -> bool:
    """Cheap first look at an event's text: could it be a collective's kernel (NCCL's or a
    symmetric-memory one)? ``kernel_family`` decides."""
    return "nccl" in text or any(marker in text for marker in _SYMM_MEM_MARKERS)


def kernel_family(name: str) -> str | None:
    """``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` -> ``"AllReduce"``, a symmetric-memory
    kernel -> its op (``"one_shot_all_reduce"``); None if neither."""
    match = _FAMILY.match(name)
    if match:
        return match.group(1)
    if "_kernel" not in name:
        return None
    match = _SYMM_MEM_FAMILY.search(name)
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
    graphed_nccl_kernels: int = 0  # NCCL kernels of every graph launch in the trace
    kernels_left: int = 0  # of which not annotated (unmatched, or of launches no ledger knows)
    mismatches: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what else the user should know

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _wanted(chunk: str) -> bool:
    """Cheap first look at an event's text: might matching need it? (``annotate`` decides.)"""
    return may_name_a_collective_kernel(chunk) or "GraphLaunch" in chunk or (
        REPLAY_PREFIX in chunk) or '"thread_name"' in chunk or '"gloo:' in chunk or (
        '"ProfilerStep#' in chunk)


@dataclass
class Scan:
    """What annotating reads of a trace."""

    launches: list[tuple[float, Any, Any, int]] = field(default_factory=list)  # ts, pid, tid, corr
    markers: dict[tuple[Any, Any], list[tuple[float, float, str]]] = field(
        default_factory=lambda: defaultdict(list))
    kernels: dict[Any, list[int]] = field(default_factory=lambda: defaultdict(list))
    flows: dict[tuple[Any, Any], list[int]] = field(default_factory=lambda: defaultdict(list))
    named_tids: set[tuple[Any, Any]] = field(default_factory=set)
    by_node: list[int] = field(default_factory=list)
    nccl_kernels: int = 0
    nccl_with_args: int = 0  # eager kernels (or annotated already)
    gloo_collectives: int = 0  # gloo's profiler ranges ("gloo:all_reduce", ...)
    nccl: list[int] = field(default_factory=list)  # every NCCL kernel, in trace order
    gloo: list[int] = field(default_factory=list)  # every gloo range
    steps: list[tuple[float, float, int]] = field(default_factory=list)  # ProfilerStep#N

    @classmethod
    def of(cls, trace: Trace) -> Scan:
        scan = cls()
        for i in trace.scan(_wanted):
            event = trace.event(i)
            cat, name = event.cat, event.name
            if cat == "kernel" and kernel_family(name):
                scan.nccl_kernels += 1
                scan.nccl_with_args += event.collective
                scan.nccl.append(i)
                if event.node:
                    scan.by_node.append(i)
                scan.kernels[event.correlation].append(i)
            elif cat == "cuda_runtime" and name.startswith(("cudaGraphLaunch", "cuGraphLaunch")):
                scan.launches.append((event.ts, event.pid, event.tid, event.correlation))
            elif cat == "user_annotation" and name.startswith(REPLAY_PREFIX):
                scan.markers[(event.pid, event.tid)].append(
                    (event.ts, event.ts + event.dur, name[len(REPLAY_PREFIX):]))
            elif cat == "user_annotation" and name.startswith("gloo:"):
                scan.gloo_collectives += 1
                scan.gloo.append(i)
            elif name.startswith("ProfilerStep#") and name[13:].isdigit():
                scan.steps.append((event.ts, event.ts + event.dur, int(name[13:])))
            elif cat == "ac2g" and event.ph == "f":
                scan.flows[(event.tid, event.ts)].append(i)
            elif event.ph == "M" and name == "thread_name":
                scan.named_tids.add((event.pid, event.tid))
        for marker_list in scan.markers.values():
            marker_list.sort()
        return scan

    def graphed_kernels(self) -> int:
        return sum(len(self.kernels.get(c, ())) for _, _, _, c in self.launches)

    def replayed_graphs(self) -> set[str]:
        return {graph for markers in self.markers.values() for _, _, graph in markers}

    def nothing_to_annotate(self, trace: Trace) -> str | None:
        """Why a trace has nothing to annotate, and what to run instead; None if it has."""
        path = trace.path
        graphed = [i for _, _, _, c in self.launches for i in self.kernels.get(c, ())]
        if graphed and all(trace.event(i).collective for i in graphed):
            return (f"{path}: its {len(graphed)} graphed NCCL kernels carry collective args "
                    "already (annotated in the job, AUTOANNOT_ANNOTATE_ON_EXPORT=1): nothing "
                    "to annotate")
        if graphed:
            return None
        if self.by_node:
            return None
        if self.launches:
            return (f"{path}: {len(self.launches)} CUDA graph launches, none with an NCCL "
                    "kernel: no graphed collective to annotate")
        if self.nccl_kernels:
            return (f"{path}: no CUDA graph replays; its {self.nccl_kernels} NCCL kernels are "
                    f"eager ({self.nccl_with_args} carry collective args already): nothing to "
                    f"annotate; autoannot summary {path} reports them")
        if self.gloo_collectives:
            return (f"{path}: a CPU trace ({self.gloo_collectives} gloo collectives; gloo "
                    "runs no GPU kernels): nothing to annotate; autoannot summary "
                    f"{path} lists them")
        return (f"{path}: no CUDA graph replays and no collectives in this trace: nothing "
                "to annotate")


def check_ledger(scan: Scan, ledger: dict[str, Any], trace: Trace,
                 ledger_path: Path | str) -> tuple[list[str], dict[str, str]]:
    """Whether ``ledger`` belongs to ``trace``: what says it is another's (another rank,
    another process: a list of reasons, empty when it is this trace's), and the graphs it
    disagrees on (graph -> why: the trace replays a graph it does not list, or with another
    kernel count)."""
    problems = []
    rank = ledger.get("rank")
    trace_rank = trace.metadata().get("distributedInfo", {}).get("rank")
    if rank is not None and trace_rank is not None and rank != trace_rank:
        problems.append(f"the ledger is rank {rank}'s, the trace rank {trace_rank}'s")
    pid = ledger.get("pid")
    pids = {launch_pid for _, launch_pid, _, _ in scan.launches}
    if pid is not None and pids and pid not in pids:
        problems.append(f"the ledger was written by process {pid}, the trace's graphs were "
                        f"launched by process {', '.join(map(str, sorted(pids, key=str)))}")
    disagree: dict[str, str] = {}
    graphs = ledger.get("graphs") or {}
    if graphs:  # (a ledger of toolsId maps alone names no graph)
        for graph in sorted(scan.replayed_graphs() - set(graphs)):
            disagree[graph] = "the trace replays it, the ledger does not list it"
    counts: dict[str, set[int]] = defaultdict(set)
    for ts, launch_pid, tid, correlation in scan.launches:
        graph = _enclosing(scan.markers.get((launch_pid, tid), []), ts)
        if graph in graphs:
            counts[graph].add(len(scan.kernels.get(correlation, ())))
    for graph, seen in sorted(counts.items()):
        if len(graphs[graph]) not in seen:
            disagree[graph] = (f"it launches {'/'.join(map(str, sorted(seen)))} NCCL kernels "
                               f"per replay, the ledger lists {len(graphs[graph])} collectives")
    if problems:
        problems.append(f"({ledger_path}; --force uses it anyway)")
    return problems, disagree


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
                return dump_event(self.apply_to_event(index, json.loads("{" + chunk + "}")))
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


def annotate(trace: Trace, ledger: dict[str, Any], lanes: bool = False,
             scan: Scan | None = None) -> tuple[Report, Patches]:
    """Annotate ``trace`` with ``ledger``; returns the report and the patches to write.
    ``lanes``: move annotated kernels (and their flow ends) to their group's lane."""
    scan = scan if scan is not None else Scan.of(trace)
    report = Report(str(trace.path))
    graphs: dict[str, list[dict]] = ledger.get("graphs") or {}
    tools_id = {int(k): v for k, v in (ledger.get("tools_id") or {}).items()}
    report.graph_launches = len(scan.launches)
    report.graphed_nccl_kernels = scan.graphed_kernels()

    patches = Patches()
    named_lanes: dict[Any, tuple[Any, str]] = {}  # lane -> (pid, its row name)
    streamed = trace.document is None

    def apply(index: int, annotation: dict[str, Any]) -> None:
        event = trace.event(index)
        lane = annotation.get(V.STREAM) if lanes else None
        patches.kernels[index] = (annotation, lane)
        if lane is not None:
            if streamed:
                patches.maybe_flows[index + 1] = (lane, event.ts)
            else:
                for flow in scan.flows.get((event.tid, event.ts), ()):
                    patches.flows[flow] = lane
            if lane not in named_lanes:
                named_lanes[lane] = (event.pid, _lane_name(annotation))
        report.kernels_annotated += 1

    for index in scan.by_node:  # torch's toolsId path
        entry = tools_id.get(int(trace.event(index).node))
        if entry:
            merged: dict[str, Any] = {}
            for annotation in entry:
                if isinstance(annotation, dict):
                    merged.update(annotation)
            apply(index, merged)
            report.by_tools_id += 1

    ledgers: dict[str, _Ledger] = {}
    unmarked = unknown = 0
    for ts, pid, tid, correlation in sorted(scan.launches, key=lambda launch: launch[0]):
        graph = _enclosing(scan.markers.get((pid, tid), []), ts)
        entries = graphs.get(graph) if graph is not None else None
        if entries is None:
            if scan.kernels.get(correlation):
                unmarked += graph is None
                unknown += graph is not None
            continue
        if graph not in ledgers:
            ledgers[graph] = _Ledger(entries)
        report.launches_of_known_graphs += 1
        ordered = sorted(scan.kernels.get(correlation, []), key=lambda i: trace.event(i).ts)
        todo = [i for i in ordered if i not in patches.kernels]
        report.kernels_expected += len(ordered)
        _match(trace, graph, correlation, todo, ledgers[graph], apply, report)
    graphed = {i for _, _, _, c in scan.launches for i in scan.kernels.get(c, ())}
    report.kernels_left = len(graphed - set(patches.kernels))
    if unmarked:
        report.notes.append(
            f"{unmarked} graph launches with NCCL kernels ran outside any autoannot replay "
            "range: replayed with the agent off, or traced by a profiler the agent did not see "
            "start; their kernels are left as they are")
    if unknown:
        report.notes.append(f"{unknown} graph launches replay graphs the ledger does not list")
    if graphs and not report.launches_of_known_graphs and not report.by_tools_id:
        report.notes.append(
            f"none of the ledger's {len(graphs)} graphs replays in this trace (was the profiler "
            "running while they replayed?)")

    for lane, (pid, name) in sorted(named_lanes.items(), key=lambda item: item[0]):
        if (pid, lane) not in scan.named_tids:
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
        deepest = [0]

        def search() -> bool:
            """Depth-first over the choices, with a stack of its own (a replay can hold
            thousands of kernels: no recursion); at most ``_SEARCH_LIMIT`` steps."""
            count = len(kernels)
            # Per level: the lanes that fit its kernel, the next one to try, the lane's end
            # before the choice made there.
            stack: list[list[Any]] = [[[li for _, li in sorted(candidates(0))], 0, 0.0]]
            k = steps = 0
            while stack:
                steps += 1
                if steps > _SEARCH_LIMIT:
                    return False
                deepest[0] = max(deepest[0], k)
                level = stack[-1]
                lanes_fit, tried, _ = level
                if tried:  # undo this level's last choice
                    li = chosen.pop()
                    head[li] -= 1
                    lane_end[li] = level[2]
                if tried == len(lanes_fit):
                    stack.pop()
                    k -= 1
                    continue
                li = lanes_fit[tried]
                level[1], level[2] = tried + 1, lane_end[li]
                head[li] += 1
                lane_end[li] = ends[k]
                chosen.append(li)
                k += 1
                if k == count:
                    return True
                stack.append([[li for _, li in sorted(candidates(k))], 0, 0.0])
            return False

        if not search():
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

class NothingToAnnotate(TraceError):
    """A readable trace with no graphed collective (eager, CPU, or no replays): says what it
    holds and what to run instead."""


def annotate_file(trace_path: str | os.PathLike[str], output: str | os.PathLike[str],
                  ledger_path: str | os.PathLike[str] | None = None, lanes: bool = False,
                  force: bool = False) -> Report:
    """Annotate one trace file with its ledger (found next to it unless given); write ``output``
    (``.json``, ``.json.gz`` or ``.pftrace``). ``lanes``: move annotated kernels to their
    process group's lane (see ``annotate``). A ledger that does not belong to the trace (see
    ``check_ledger``) raises TraceError unless ``force``; a trace with nothing to annotate
    raises ``NothingToAnnotate``."""
    trace_path, output = Path(trace_path), Path(output)
    if not trace_path.is_file():
        raise TraceError(f"{trace_path}: no such file")
    trace = Trace(trace_path)
    scan = Scan.of(trace)
    report, patches, ledger_file = prepare(trace, scan, ledger_path, lanes, force)
    write(trace, patches, output, report, ledger_file)
    return report


def prepare(trace: Trace, scan: Scan, ledger_path: str | os.PathLike[str] | None = None,
            lanes: bool = False, force: bool = False) -> tuple[Report, Patches, Path | None]:
    """The annotation of a trace already scanned (``Scan.of``), in memory: its report, what
    it changes (``Patches``) and the ledger it used. Raises as ``annotate_file``."""
    trace_path = trace.path
    if ledger_path is not None:
        ledger_file: Path | None = Path(ledger_path)
        ledger = ledgers.load(ledger_file)
    else:
        ledger_file = ledgers.find(trace_path)
        reason = scan.nothing_to_annotate(trace)
        if reason is not None:
            raise NothingToAnnotate(reason)
        if ledger_file is None:
            raise TraceError(
                f"{trace_path}: {scan.graphed_kernels()} graphed NCCL kernels, but no ledger "
                f"{Path(ledgers.ledger_path(trace_path)).name} next to it: export the trace "
                "with the agent on (AUTOANNOT=1), or give the ledger with --ledger FILE")
        ledger = ledgers.load(ledger_file)
    problems, disagree = check_ledger(scan, ledger, trace, ledger_file)
    if problems and not force:
        raise TraceError(f"{trace_path}: the ledger does not belong to this trace: "
                         + "; ".join(problems))
    if disagree and not force:  # the rest is this trace's: those graphs alone stay as they are
        ledger = {**ledger, "graphs": {name: entries for name, entries
                                       in (ledger.get("graphs") or {}).items()
                                       if name not in disagree}}
    report, patches = annotate(trace, ledger, lanes=lanes, scan=scan)
    if problems:
        report.notes.append("used a ledger that does not belong (--force): " + problems[0])
    for graph, why in sorted(disagree.items()):
        report.notes.append(f"{graph} left unannotated: {why} ({ledger_file}; --force uses "
                            "it anyway)" if not force else
                            f"{graph}: {why}; annotated anyway (--force)")
    return report, patches, ledger_file


def write(trace: Trace, patches: Patches, output: Path, report: Report,
          ledger_file: Path | None) -> None:
    """The annotated trace, to ``output`` (atomically; it may be the trace itself)."""
    if output.suffix == ".pftrace":
        from autoannot.traces import perfetto

        perfetto.write(trace.all_events(patches), output, trace.metadata())
    else:
        marker = {"from": trace.path.name,
                  "ledger": ledger_file.name if ledger_file is not None else None,
                  "annotated": report.kernels_annotated}
        trace.write(output, patches, marker)


def annotate_job(job: tuple[Path, Path, Path | None, bool, bool]) -> dict[str, Any]:
    """``annotate_file`` for a worker process: ``{"report": ...}``, ``{"nothing": message}``
    or ``{"error": message}`` (a trace or ledger that cannot be used, an output that cannot
    be written)."""
    trace, output, ledger, lanes, force = job
    try:
        return {"report": annotate_file(trace, output, ledger, lanes=lanes,
                                        force=force).as_dict()}
    except NothingToAnnotate as exc:
        return {"nothing": str(exc)}
    except TraceError as exc:
        return {"error": str(exc)}
    except OSError as exc:
        return {"error": f"{output}: cannot write: {exc.strerror}"}

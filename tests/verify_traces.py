"""Check annotated graph traces against eager traces of the same calls (GPU runs and CPU tests).

For each replay of a graph (the NCCL kernels sharing one ``cudaGraphLaunch`` correlation), the
annotated kernels must carry exactly the eager kernel args of the calls the graph captured:
the same multiset of arg dicts, each process group's kernels in the eager order of that group,
and each kernel's NCCL family consistent with its "Collective name".
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from autoannot.describe import vocabulary as V
from autoannot.traces import files
from autoannot.traces.read import annotate as tracetool
from autoannot.traces.read import ledger

FAMILIES = {  # "Collective name" -> NCCL kernel families it may run as
    "allreduce": {"AllReduce"}, "barrier": {"AllReduce"}, "allreduce_coalesced": {"AllReduce"},
    "_allgather_base": {"AllGather"}, "allgather_into_tensor_coalesced": {"AllGather"},
    "all_gather": {"AllGather", "Broadcast"}, "_reduce_scatter_base": {"ReduceScatter"},
    "reduce_scatter": {"ReduceScatter"}, "reduce_scatter_tensor_coalesced": {"ReduceScatter"},
    "broadcast": {"Broadcast"}, "reduce": {"Reduce"}, "all_to_allv": {"SendRecv"},
    "all_to_all": {"SendRecv"}, "send": {"SendRecv"}, "recv": {"SendRecv"},
    "gather": {"SendRecv"}, "scatter": {"SendRecv"},
}


def vocab(args: dict[str, Any]) -> dict[str, Any]:
    return {k: args[k] for k in V.KERNEL_KEYS if k in args}


def nccl_kernels(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("cat") == "kernel" and tracetool.kernel_family(
        e.get("name", ""))]


def eager_calls(path: Path) -> list[dict[str, Any]]:
    """The eager NCCL kernels' args, in launch (correlation) order."""
    events = json.loads(files.read_text(path))["traceEvents"]
    kernels = [e for e in nccl_kernels(events) if V.COLLECTIVE_NAME in e.get("args", {})]
    kernels.sort(key=lambda e: e["args"]["correlation"])
    return [vocab(e["args"]) for e in kernels]


def replays(path: Path) -> list[list[dict]]:
    """The NCCL kernels of each graph launch, each list sorted by start time."""
    events = json.loads(files.read_text(path))["traceEvents"]
    launches = sorted((e for e in events if e.get("name", "").startswith("cudaGraphLaunch")),
                      key=lambda e: e["ts"])
    by_correlation = defaultdict(list)
    for e in nccl_kernels(events):
        by_correlation[e["args"].get("correlation")].append(e)
    return [sorted(by_correlation[launch["args"]["correlation"]], key=lambda e: e["ts"])
            for launch in launches]


def _key(args: dict[str, Any]) -> str:
    return json.dumps(args, sort_keys=True)


def check_replay(kernels: list[dict], expected: list[dict]) -> list[str]:
    """Differences between one annotated replay and the eager args of its body."""
    problems = []
    got = [vocab(k.get("args", {})) for k in kernels]
    missing = [g for g in got if V.COLLECTIVE_NAME not in g]
    if missing:
        problems.append(f"{len(missing)} of {len(got)} NCCL kernels carry no collective args")
    if Counter(map(_key, got)) != Counter(map(_key, expected)):
        problems.append("annotated args differ from the eager args of the same calls")
    for kernel, args in zip(kernels, got, strict=True):
        name = args.get(V.COLLECTIVE_NAME)
        family = tracetool.kernel_family(kernel["name"])
        if name is not None and family not in FAMILIES.get(name, {family}):
            problems.append(f"a {family} kernel annotated as {name}")
    per_group_got, per_group_eager = defaultdict(list), defaultdict(list)
    for args in got:
        per_group_got[args.get(V.PG_NAME)].append(_key(args))
    for args in expected:
        per_group_eager[args.get(V.PG_NAME)].append(_key(args))
    if dict(per_group_got) != dict(per_group_eager):
        problems.append("a process group's kernels are not in its eager order")
    return problems


def compare(graph_trace: Path, bodies: list[list[dict]], skip_empty: bool = False
            ) -> dict[str, Any]:
    """Replays in the trace run the bodies in turn (``bodies[i % len(bodies)]``);
    ``skip_empty``: leave out graph launches with no NCCL kernel (graphs of compute only)."""
    result = {"trace": graph_trace.name, "replays": 0, "kernels": 0, "kernels_matching": 0,
              "problems": []}
    launched = replays(graph_trace)
    if skip_empty:
        launched = [kernels for kernels in launched if kernels]
    for i, kernels in enumerate(launched):
        expected = bodies[i % len(bodies)]
        problems = check_replay(kernels, expected)
        result["replays"] += 1
        result["kernels"] += len(kernels)
        if not problems:
            result["kernels_matching"] += len(kernels)
        result["problems"] += [f"replay {i}: {p}" for p in problems]
    return result


def split_bodies(eager: list[dict], sizes: list[int]) -> list[list[dict]]:
    bodies, start = [], 0
    for size in sizes:
        bodies.append(eager[start:start + size])
        start += size
    return bodies


_KEEP_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "ac2g"}


def trim(source: Path, target: Path) -> None:
    """Keep what annotation and verification read (kernels, graph launches, replay ranges,
    flows, metadata, the eager ``record_param_comms`` ops); drop the rest. Kineto's layout is
    kept, so the tests exercise the streaming reader on real data."""
    trace = files.Trace(source)
    assert trace.head is not None, f"{source} is not in Kineto's layout"
    keep = []
    for chunk in trace._chunks():
        event = json.loads("{" + chunk + "}")
        name, cat = event.get("name", ""), event.get("cat")
        if (cat in _KEEP_CATS or event.get("ph") == "M" or name == "record_param_comms"
                or name.startswith("cudaGraphLaunch")
                or (cat == "user_annotation" and name.startswith(ledger.REPLAY_PREFIX))):
            keep.append(chunk)
    text = trace.head + files._SEPARATOR.join(keep) + trace.tail
    files.write_text(target, text)

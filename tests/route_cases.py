"""Rank bodies of the route's tests (``test_route.py``), run in real gloo processes: every launch
kind the suite has, with what writes a launch watched — every call that writes a ring record, a
record-file line, a graph's ledger entry or a recorder's record, and the function that made it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import autoannot

#: Each launch kind, in the order the body runs them.
KINDS = ("python api", "coalesced", "pg", "ddp", "compiled", "replay")
#: What each mode opens: the always-on ring alone; record() alone; everything at once (a record
#: file, a ring, record() and a capture in progress).
MODES = ("ring", "recorded", "everything")


def _watched(writes: list[tuple[str, str, str]], current: list[str]) -> list[Any]:
    """Every writer of a launch reports who called it: (the launch kind under way, the writer,
    the caller's file:qualified name); the patches, to undo."""
    from autoannot.keep import captures, journal, records, ring

    undo = []

    def watch(owner: Any, name: str) -> None:
        original = owner.__dict__[name]

        def spy(*args: Any, **kwargs: Any) -> Any:
            code = sys._getframe(1).f_code
            writes.append((current[0], f"{owner.__name__}.{name}",
                           f"{Path(code.co_filename).name}:{code.co_qualname}"))
            return original(*args, **kwargs)

        setattr(owner, name, spy)
        undo.append(lambda: setattr(owner, name, original))

    for owner, name in ((ring.Ring, "enter_kind"), (ring.Ring, "enter"),
                        (ring.Ring, "returned"), (ring.Ring, "replayed"),
                        (journal.Journal, "enter"), (captures.Captures, "note")):
        watch(owner, name)
    records.Recording.append = lambda self, record: (  # (a list's own append, reported)
        writes.append((current[0], "Recording.append", _caller())), list.append(self, record))
    undo.append(lambda: delattr(records.Recording, "append"))
    return undo


def _caller() -> str:
    code = sys._getframe(2).f_code
    return f"{Path(code.co_filename).name}:{code.co_qualname}"


def every_launch_kind(rank: int, world: int, folder: str) -> dict[str, Any]:
    """Each launch kind (``KINDS``) in each mode (``MODES``), its writes watched: what wrote,
    called from where (Python's writes); and the records each added to the ring (the native
    writer's too)."""
    from replay_cases import _graphs_module

    from autoannot.agent import graph_patches
    from autoannot.agent.instrumentation import INSTRUMENTATION as agent
    from autoannot.keep.journal import Journal
    from autoannot.keep.ring import Ring

    writes: list[tuple[str, str, str]] = []
    current = [""]
    undo = _watched(writes, current)
    agent.captures.by_thread()  # (no CUDA: a launch is in the capture of its thread)
    autoannot.enable()
    graphs = _graphs_module()
    patches = graph_patches.install(graphs, agent)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8), bucket_cap_mb=0.01)
    model(torch.ones(2, 8)).sum().backward()  # (its buckets rebuilt: the steps after are alike)
    compiled = torch.compile(lambda t: funcol.all_reduce(t, "sum", dist.group.WORLD),
                             backend="aot_eager")
    _launch("compiled", model, compiled, None)  # (compiled once, before any is watched)
    graph = graphs.CUDAGraph()
    with autoannot.record():  # (a capture's launches in its ledger: what its replays write)
        graph.capture_begin()
        dist.all_reduce(torch.ones(5))
        graph.capture_end()
    in_ring: dict[str, int] = {}  # mode/kind -> the records it added to the ring (any writer)
    for mode in MODES:
        opened = _open(mode, Path(folder) / f"rank{rank}-{mode}", agent, Ring, Journal)
        rings = [j for j in agent.state.journals if isinstance(j, Ring)]
        try:
            for kind in KINDS:
                current[0] = f"{mode}/{kind}"
                before = sum(r.count for r in rings)
                _launch(kind, model, compiled, graph)
                in_ring[current[0]] = sum(r.count for r in rings) - before
        finally:
            current[0] = f"{mode}/closing"
            for close in reversed(opened):
                close()
    current[0] = "after"
    autoannot.disable()
    for patch in reversed(patches):
        patch.undo()
    for step in undo:
        step()
    return {"writes": writes, "in_ring": in_ring}


def _open(mode: str, folder: Path, agent: Any, ring_class: Any, journal_class: Any) -> list[Any]:
    """What ``mode`` opens, and how each is closed again."""
    import contextlib

    from autoannot import testing

    closes: list[Any] = []
    stack = contextlib.ExitStack()
    closes.append(stack.close)
    if mode in ("ring", "everything"):
        kept = ring_class(str(folder))
        agent.state.open_journal(kept)
        closes += [lambda: agent.state.close_journal(kept), kept.close]
        if agent.layer is not None:  # (as a ring open from start-up holds the Python layer on
            agent.layer.hold_for_good()  # every thread: AUTOANNOT_RING)
            agent.layer.hold_new_threads()
    if mode == "everything":
        journal = journal_class(str(folder / "record.jsonl"))
        agent.state.open_journal(journal)
        closes += [lambda: agent.state.close_journal(journal), journal.close]
        stack.enter_context(testing.stand_in())
    if mode in ("recorded", "everything"):
        stack.enter_context(autoannot.record())
    return closes


def _launch(kind: str, model: Any, compiled: Any, graph: Any) -> None:
    t = torch.ones(4)
    if kind == "python api":
        dist.all_reduce(t)
    elif kind == "coalesced":
        with dist._coalescing_manager():
            dist.all_reduce(torch.ones(2))
            dist.all_reduce(torch.ones(3))
    elif kind == "pg":
        dist.group.WORLD.allreduce([t]).wait()
    elif kind == "ddp":
        model(torch.ones(2, 8)).sum().backward()
    elif kind == "compiled":
        result = compiled(t)
        if hasattr(result, "wait"):
            result.wait()
    elif kind == "replay":
        graph.replay()

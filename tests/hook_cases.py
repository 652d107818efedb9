"""Rank functions for ``test_group_hooks.py``: run on real gloo ranks by ``harness.run_ranks``."""

from __future__ import annotations

import functools
import os
import weakref
from typing import Any


def _torch_kernels_only() -> bool:
    """No kernel of the agent on torch's dispatcher: the Python layer never registered any,
    and no ``c10d::`` op has a kernel under its key."""
    import torch

    from autoannot.agent.instrumentation import INSTRUMENTATION
    from autoannot.observe import python_layer

    layer = INSTRUMENTATION.layer
    ops = [f"c10d::{name}" for name in ("allreduce_", "broadcast_", "_allgather_base_")]
    return (layer is None or layer.registrations == 0) and not any(
        torch._C._dispatch_has_kernel_for_dispatch_key(op, python_layer.KEY) for op in ops)


def _foreign_fallback() -> Any:
    """What torchdistx does when it loads: its own fallback for every op on ``DeferredInit``,
    the key the Python layer would borrow (which then steps aside)."""
    import torch

    library = torch.library.Library("_", "IMPL")
    below = torch._C._dispatch_keyset_full_after(torch._C._dispatch_key_parse("DeferredInit"))

    def fallback(keyset: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        return op.redispatch(keyset & below, *args, **kwargs)

    library.fallback(fallback, "DeferredInit", with_keyset=True)
    return library


def _ddp_on_a_counted_group(world: int) -> tuple[Any, Any, list[str]]:
    """A group made now (the agent hooks it as it is made), a hook of the test's own counting
    what it launches, and DDP over it past its first step (buckets rebuilt); the count empty."""
    import torch
    import torch.distributed as dist

    counted: list[str] = []
    group = dist.new_group(list(range(world)))
    group.register_pre_hook(7, lambda args: counted.append(args.name.name))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)),
        process_group=group, bucket_cap_mb=0.01)
    model(torch.ones(2, 64)).sum().backward()
    counted.clear()
    return group, model, counted


def below_the_python_api(rank: int, world: int, foreign: bool) -> dict[str, Any]:
    """``record()`` around what no proxy sees: a DDP step (its reducer's bucket all-reduces,
    from C++ on autograd's thread), ``pg.allreduce``, a coalesced all-reduce through the group
    object, and a ``pg.allreduce`` on another thread — each counted by a hook of the test's
    own. ``foreign``: another library owns the key the Python layer would borrow."""
    import threading

    import torch
    import torch.distributed as dist

    import autoannot
    from autoannot.agent.instrumentation import INSTRUMENTATION

    library = _foreign_fallback() if foreign else None
    autoannot.enable()
    group, model, counted = _ddp_on_a_counted_group(world)
    elsewhere = threading.Thread(target=lambda: group.allreduce([torch.ones(11)]).wait())
    with autoannot.record() as records:
        model(torch.ones(2, 64)).sum().backward()
        group.allreduce([torch.ones(3)]).wait()
        group.allreduce_coalesced([torch.ones(2), torch.ones(5)]).wait()
        elsewhere.start()
        elsewhere.join()
    layer = INSTRUMENTATION.layer
    result = {
        "counted": counted,
        "records": [(r.api, r.annotation.get("Collective name"), r.annotation.get("In msg nelems"),
                     r.annotation.get("Process Group Name")) for r in records],
        "group_name": dist.distributed_c10d._get_process_group_name(group),
        "hooks_on_after": INSTRUMENTATION.hooks is not None and INSTRUMENTATION.hooks.on,
        "layer_made": layer is not None,
        "native_observer": INSTRUMENTATION.observer is not None,
        "native_hooks": INSTRUMENTATION.hooks is not None
        and INSTRUMENTATION.hooks.native is not None,
        "torch_kernels_only": _torch_kernels_only(),
    }
    autoannot.disable()
    del library
    return result


def journal_of_a_job(rank: int, world: int, out: str) -> dict[str, Any]:
    """``AUTOANNOT_RECORD`` (set before the agent starts): a DDP step's launches in the record
    file, each once."""
    import json

    import torch
    import torch.distributed as dist

    import autoannot

    assert autoannot.is_enabled() and os.environ.get("AUTOANNOT_RECORD")
    counted: list[str] = []
    group = dist.new_group(list(range(world)))
    group.register_pre_hook(7, lambda args: counted.append(args.name.name))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32),
                                                      process_group=group)
    model(torch.ones(2, 32)).sum().backward()
    with open(f"{out}/rank{rank}.jsonl") as lines_read:
        lines = [json.loads(line) for line in lines_read]
    return {"counted": counted, "journal": [(line["api"], line["group"]) for line in lines]}


#: A stand-in of torch's own collective annotations (pytorch main,
#: ``torch/distributed/_collective_annotations.py``), by its public contract: gated hooks on
#: each group, at the ids it uses, entering ``mark_kernels`` with a subset of the eager fields
#: (and two of its own) while a capture is in progress.
TORCH_PRE_HOOK_ID = 1 << 62
TORCH_POST_HOOK_ID = -TORCH_PRE_HOOK_ID


def _torchs_fields(group: Any, args: Any) -> dict[str, Any]:
    inputs, outputs = list(args.input_tensors), list(args.output_tensors)
    in_place = args.name.name in ("BROADCAST", "ALLREDUCE", "REDUCE", "ALLREDUCE_COALESCED")
    return {"Collective name": args.name.name.lower(),
            "In msg nelems": sum(t.numel() for t in inputs),
            "Out msg nelems": sum(t.numel() for t in (inputs if in_place else outputs)),
            "Group size": group.size(), "Process Group Name": group.group_name,
            "Is asynchronized op": args.async_op, "Rank": group.rank()}


class ScopeLog:
    """``mark_kernels`` stand-ins for the agent and for torch's annotations, logging each
    scope's entry (with its annotation) and exit, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def marks(self, who: str) -> Any:
        log = self.events

        class Scope:
            def __init__(self, annotation: dict[str, Any]) -> None:
                self.annotation = dict(annotation)

            def __enter__(self) -> None:
                log.append(("enter", who, self.annotation))

            def __exit__(self, *exc: Any) -> None:
                log.append(("exit", who))

        return Scope

    def brackets(self) -> list[list[tuple[str, dict[str, Any]]]]:
        """The outermost scopes, each with the scopes entered inside it, in entry order; the
        entries and exits must nest (an exit closes the last scope entered)."""
        stack: list[str] = []
        found: list[list[tuple[str, dict[str, Any]]]] = []
        for event in self.events:
            if event[0] == "enter":
                if not stack:
                    found.append([])
                found[-1].append((event[1], event[2]))
                stack.append(event[1])
            else:
                assert stack and stack.pop() == event[1], self.events
        assert not stack
        return found


def _beside_torchs_annotations(group: Any, torch_scope: Any, capturing: list[bool]) -> None:
    """The stand-in of torch's collective annotations on ``group``, beside the agent's hooks,
    run as torch's contract runs hooks: in ascending id order (torch 2.14 and 2.15 keep them
    unordered: the agent's and the stand-in's pairs go through one hook that runs them in
    that order)."""
    from autoannot.agent.instrumentation import INSTRUMENTATION
    from autoannot.observe import group_hooks

    observer = INSTRUMENTATION.hooks
    group.unregister_pre_hook(group_hooks.HOOK_ID)  # (the agent's, run below in their order)
    group.unregister_post_hook(group_hooks.HOOK_ID)
    open_scopes: dict[int, Any] = {}

    def torch_pre(args: Any) -> None:
        if capturing[0]:
            scope = open_scopes[args.op_id] = torch_scope(_torchs_fields(group, args))
            scope.__enter__()

    def torch_post(args: Any) -> None:
        scope = open_scopes.pop(args.op_id, None)
        if scope is not None:
            scope.__exit__(None, None, None)

    pre = sorted([(group_hooks.HOOK_ID, functools.partial(observer._before, weakref.ref(group))),
                  (TORCH_PRE_HOOK_ID, torch_pre)], key=lambda hook: hook[0])
    post = sorted([(group_hooks.HOOK_ID, functools.partial(observer._after, id(group))),
                   (TORCH_POST_HOOK_ID, torch_post)], key=lambda hook: hook[0])
    group.register_pre_hook(1, lambda args: [hook(args) for _, hook in pre])
    group.register_post_hook(1, lambda args: [hook(args) for _, hook in post])


def captured_with_torchs_annotations(rank: int, world: int, torch_annotates: bool
                                    ) -> dict[str, Any]:
    """A stand-in capture (no CUDA here) of a DDP step (buckets from C++), a ``pg.allreduce``
    and a ``dist.all_reduce`` (a proxy's), with the agent's ``mark_kernels`` a stand-in and,
    where ``torch_annotates``, torch's collective annotations' stand-in hooks on the group."""
    import agent_hooks as hooks
    import torch
    import torch.distributed as dist

    import autoannot
    from autoannot.base import features

    log = ScopeLog()
    agent_scope = log.marks("autoannot")
    features.mark_kernels = lambda allowed=True: agent_scope
    autoannot.enable()
    hooks.AGENT.captures.by_thread()
    group, model, counted = _ddp_on_a_counted_group(world)
    capturing = [False]
    if torch_annotates:
        _beside_torchs_annotations(group, log.marks("torch"), capturing)
    graph = type("Graph", (), {})()
    hooks.begin_capture(lambda: None, graph, (), {})
    capturing[0] = True
    model(torch.ones(2, 64)).sum().backward()
    group.allreduce([torch.ones(3)]).wait()
    dist.all_reduce(torch.ones(5), group=group)
    capturing[0] = False
    hooks.end_capture(lambda: None, graph, (), {})
    entries = hooks.LEDGERS[graph._autoannot_graph].entries
    result = {
        "counted": counted,
        "brackets": log.brackets(),
        "ledger": [(e["api"], e["annotation"]["In msg nelems"]) for e in entries],
        "observer": ("hooks" if hooks.AGENT.hooks is not None else
                     "layer" if hooks.AGENT.layer is not None else "native"),
    }
    autoannot.disable()
    return result


def _line_below() -> int:
    """The line after the caller's: where the call the test plants is."""
    import sys

    return sys._getframe(1).f_lineno + 1


def ring_of_a_job(rank: int, world: int, folder: str) -> dict[str, Any]:
    """The always-on ring (opened before ``enable()``, as ``AUTOANNOT_RING`` opens it) around
    what a job launches, each at a line it knows: DDP steps (its reducer's buckets, from C++),
    ``pg.allreduce``, a proxied ``dist.all_reduce``, a ``pg.allreduce`` on another thread, one
    on a second group. A hook of the test's own counts what each group launched, by name and
    input size, in order; the ring's records are read back from its files."""
    import threading

    import torch
    import torch.distributed as dist

    import autoannot
    from autoannot.agent.instrumentation import INSTRUMENTATION
    from autoannot.keep.ring import Ring

    ring = Ring(folder)
    INSTRUMENTATION.state.open_journal(ring)
    autoannot.enable()
    group, model, counted = _ddp_on_a_counted_group(world)
    other = dist.new_group(list(range(world)))
    sizes: list[int] = []
    group.register_pre_hook(8, lambda args: sizes.append(args.input_tensors[0].numel()))
    model(torch.ones(2, 64)).sum().backward()  # (its buckets' indices broadcast, once)
    lines: dict[str, int] = {}
    sizes.clear()
    before = ring.count  # (DDP's set-up and first steps: not planted here)
    native = INSTRUMENTATION.hooks.native
    written_before = native.hook_counts()[0] if native is not None else 0
    for _ in range(3):
        lines["backward"] = _line_below()
        model(torch.ones(2, 64)).sum().backward()
        lines["pg.allreduce"] = _line_below()
        group.allreduce([torch.ones(3)]).wait()
        lines["dist.all_reduce"] = _line_below()
        dist.all_reduce(torch.ones(5), group=group)
    lines["thread"] = _line_below()
    elsewhere = threading.Thread(target=lambda: group.allreduce([torch.ones(11)]).wait())
    elsewhere.start()
    elsewhere.join()
    lines["other group"] = _line_below()
    other.allreduce([torch.ones(13)]).wait()
    with autoannot.record() as recorded:  # (the hooks hand launches to Python meanwhile)
        lines["recorded"] = _line_below()
        group.allreduce([torch.ones(3)]).wait()
    planted = list(sizes)
    written_here = (native.hook_counts()[0] if native is not None else 0) - written_before
    path, count = ring.ring_path, ring.count
    INSTRUMENTATION.state.close_journal(ring)
    ring.close()
    autoannot.disable()
    group.allreduce([torch.ones(3)]).wait()  # (after: into no ring)
    from pathlib import Path

    from autoannot.traces.read import ring_files

    read = ring_files.read(Path(path))
    records = read.records
    return {
        "native": native is not None, "written_here": written_here, "count": count,
        "before": before,
        "recorded": [(r.annotation.get("In msg nelems"), r.call_site) for r in recorded],
        "counted": counted, "sizes": planted, "lines": lines, "file": __file__,
        "group": dist.distributed_c10d._get_process_group_name(group),
        "other": dist.distributed_c10d._get_process_group_name(other),
        "launches": [(launch.group, launch.seq, launch.collective, launch.size_bytes,
                      launch.call_site) for launch in ring_files.launches_of(read)],
        "returned_after_entry": [int(r) >= int(e) > 0 for e, r in
                                 zip(records["entered_ns"], records["returned_ns"],
                                     strict=True)],
    }

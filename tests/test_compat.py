"""The agent next to everything else: FSDP2 and DTensor, threads toggling it, fork, mocks."""

from __future__ import annotations

import os
import threading
import time
from typing import Any
from unittest import mock

import pytest
import scenarios
import torch
import torch.distributed as dist
import wrapt
from harness import run_ranks, skip_if_torch_cannot

import autoannot
from autoannot.describe import vocabulary as V


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_and_dtensor_are_annotated_and_unchanged(world: int) -> None:
    results = run_ranks(scenarios.fsdp_and_dtensor, world, "gloo")
    skip_if_torch_cannot(results)
    for result in results:
        assert result["same"]  # bitwise: loss, gradients, redistributed tensor
        names = [r["annotation"][V.COLLECTIVE_NAME] for r in result["records"]]
        assert "_allgather_base" in names and "_reduce_scatter_base" in names  # FSDP2
        assert "allgather_into_tensor_coalesced" in names  # DTensor Shard -> Replicate
        descs = {r["annotation"][V.PG_DESC] for r in result["records"]}
        assert result["dp_desc"] in descs
        if world == 4:
            assert result["dp_desc"] == "mesh_dp"
        # One record per launch (gloo's profiler ranges), all from the Python API: the
        # c10d:: kernels under it add nothing, the records are what they were without them.
        assert len(result["records"]) == len(result["gloo"])
        assert not [r["api"] for r in result["records"] if r["api"].startswith("c10d.")]


def _all_reduce_op(tensor: torch.Tensor, group: Any) -> None:
    """What compiled code calls: the functional op (through our dispatcher kernel), then wait."""
    ops = torch.ops._c10d_functional
    ops.wait_tensor.default(ops.all_reduce_.default(tensor, "sum", group.group_name))


def _all_reduce_pg(tensor: torch.Tensor, group: Any) -> None:
    """What C++ callers do (DDP's reducer, extensions): the ProcessGroup itself, no proxy."""
    group.allreduce([tensor]).wait()


def _on_a_recording_thread(work: Any) -> Any:
    """C++-origin and compiled-code launches are seen on threads that hold the dispatcher
    layer: one with a ``record(dispatcher=True)`` open does (its records also reach every
    other open recorder)."""
    def run(t: int) -> None:
        with autoannot.record(dispatcher=True):
            work(t)
    return run


@pytest.mark.parametrize("via", ["c10d", "op", "pg"])
def test_threads_and_a_toggling_thread(fake_world, via: str) -> None:
    """8 threads on 8 process groups, a recorder open, another thread toggling the agent: no
    crash, no deadlock, and every call that ran wholly while the agent stayed on is recorded
    exactly once (calls are told apart by their tensor sizes). ``op`` and ``pg``: the calls go
    through the functional op or the ProcessGroup (no proxy), so only dispatcher kernels see
    them, while the toggling asks for their removal from another thread."""
    all_reduce = {"op": _all_reduce_op, "pg": _all_reduce_pg}.get(via) or (
        lambda tensor, group: dist.all_reduce(tensor, group=group))
    groups = [dist.new_group([0, 1]) for _ in range(8)]
    generation = [0]
    stop = threading.Event()
    seen: list[tuple[int, bool]] = []  # (numel, must be recorded)

    def toggle() -> None:
        flips = 0
        time.sleep(0.05)  # a calm start: the workers' first calls run wholly with the agent on
        while not stop.is_set():
            generation[0] += 1  # before and after: a call that saw one value saw no toggle
            autoannot.disable() if autoannot.is_enabled() else autoannot.enable()
            generation[0] += 1
            flips += 1
            # let calls run between toggles too; every other on-phase is calm (50 ms), so that
            # calls run wholly while the agent stays on even on a loaded machine
            calm = autoannot.is_enabled() and flips % 4 == 0
            time.sleep(0.05 if calm else 0.002)

    def work(t: int) -> None:
        for i in range(150):
            numel = 1 + t * 1000 + i
            before, on = generation[0], autoannot.is_enabled()
            all_reduce(torch.ones(numel), groups[t])
            # an even generation: no toggle was under way when the call started
            seen.append((numel, on and before % 2 == 0 and generation[0] == before))

    autoannot.enable()
    try:
        with autoannot.record() as records:
            toggler = threading.Thread(target=toggle)
            target = _on_a_recording_thread(work) if via in ("pg", "op") else work
            workers = [threading.Thread(target=target, args=(t,)) for t in range(8)]
            toggler.start()
            for w in workers:
                w.start()
            for w in workers:
                w.join(timeout=60)
            stop.set()
            toggler.join(timeout=60)
            assert not any(w.is_alive() for w in workers) and not toggler.is_alive()
    finally:
        autoannot.disable()
    counts: dict[int, int] = {}
    for r in records:
        counts[r.annotation[V.IN_NELEMS]] = counts.get(r.annotation[V.IN_NELEMS], 0) + 1
    assert all(c == 1 for c in counts.values())  # never twice
    must = [n for n, required in seen if required]
    assert must and all(counts.get(n) == 1 for n in must)
    assert len(seen) == 8 * 150
    group_of = {g.group_name: t for t, g in enumerate(groups)}
    for r in records:  # each record names its thread's own group
        assert group_of[r.annotation[V.PG_NAME]] == (r.annotation[V.IN_NELEMS] - 1) // 1000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_fork_after_enable_leaves_a_working_child(fake_world, agent) -> None:
    with autoannot.record():
        dist.all_reduce(torch.ones(2))
    pid = os.fork()
    if pid == 0:  # the child: locks and caches must work
        code = 1
        try:
            autoannot.disable()
            autoannot.enable()
            with autoannot.record() as records:
                dist.all_reduce(torch.ones(3))
            code = 0 if records.apis() == ["all_reduce"] else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_mock_patch_of_a_collective_keeps_working(fake_world, agent) -> None:
    proxy = dist.all_reduce
    with mock.patch("torch.distributed.all_reduce") as fake:
        dist.all_reduce(torch.ones(2))
        fake.assert_called_once()
    assert dist.all_reduce is proxy
    with mock.patch.object(dist, "broadcast", wraps=dist.broadcast) as spy, \
            autoannot.record() as records:
        dist.broadcast(torch.ones(2), src=0)
    spy.assert_called_once()
    assert records.apis() == ["broadcast"]
    autoannot.disable()
    assert not isinstance(dist.all_reduce, wrapt.FunctionWrapper)

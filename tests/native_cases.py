"""What each rank runs for test_native.py: C++-origin launches in a capture, noted by the
native kernel and, the same launches, annotated by the Python kernels.

There is no CUDA here: a capture is what ``CUDAGraph.capture_begin``/``capture_end``'s wrappers
see (``capture._capture_begin`` on a stand-in graph), and the native kernel is told which
capture every launch goes into (``set_test_capture``), as CUDA would tell it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

import autoannot
from autoannot import capture, native


def _launches(pg: Any, sub: Any, rank: int, world: int) -> None:
    """ProcessGroup calls (C++-origin: no proxy sees them) and Python-API calls, mixed."""
    x = torch.arange(8, dtype=torch.float32) + rank
    pg.allreduce([x]).wait()
    dist.all_reduce(x)  # a Python-API launch between C++-origin ones
    pg.allreduce_coalesced([torch.ones(3), torch.ones(5)]).wait()
    pg.allgather([[torch.zeros(8) for _ in range(world)]], [x]).wait()
    pg._allgather_base(torch.zeros(8 * world), x).wait()
    pg.broadcast(torch.ones(4, dtype=torch.bfloat16), 1).wait()
    pg.reduce(torch.ones(6, dtype=torch.int64), 0).wait()
    pg.alltoall_base(torch.zeros(2 * world), torch.ones(2 * world), [2] * world,
                     [2] * world).wait()
    pg.allreduce([torch.ones(3, dtype=torch.complex64)]).wait()
    if sub is not None:
        sub.allreduce([torch.ones(7, dtype=torch.float16)]).wait()
    dist.broadcast(x, 0)
    peer = rank ^ 1
    if rank % 2 == 0:
        pg.send([torch.ones(5)], peer, 0).wait()
    else:
        pg.recv([torch.zeros(5)], peer, 0).wait()
    pg.barrier().wait()


def _captured(test_capture: int, body: Any) -> list[dict[str, Any]]:
    """The ledger of one stand-in capture of ``body()``; ``test_capture``: the native kernel
    notes its launches (0: it lets them through to the Python kernels)."""
    with capture.stand_in(test_capture) as graph:
        body()
    return [{"api": e["api"], "annotation": e["annotation"], "kernels": e["kernels"],
             "call_site": e["call_site"]}
            for e in capture.LEDGERS[graph._autoannot_graph].entries]


def _start() -> None:
    """The agent on; a launch's capture is its thread's (no CUDA here: a CUDA build of torch
    with no driver would find no capture at all)."""
    capture.IDENTITY = capture.CaptureIdentity(capture.ByThread())
    autoannot.enable()


def _noted() -> int:
    module = native.loaded()
    return module.noted() if module is not None else -1


def mixed_launches(rank: int, world: int) -> dict[str, Any]:
    _start()
    pg = dist.group.WORLD
    sub = dist.new_group([r for r in range(world) if r % 2 == 0])
    sub = sub if rank % 2 == 0 else None
    _captured(0, lambda: None)  # the layer's kernels go on at its first hold
    loaded = native.loaded() is not None
    before = _noted()
    python_kernels = _captured(0, lambda: _launches(pg, sub, rank, world))
    after_python = _noted()
    noted = _captured(11, lambda: _launches(pg, sub, rank, world))
    after_native = _noted()
    kinds = native.loaded().kinds()
    again = _captured(11, lambda: _launches(pg, sub, rank, world))  # each kind derived once
    return {"loaded": loaded, "python": python_kernels, "native": noted, "again": again,
            "noted_by_python_run": after_python - before,
            "noted_by_native_run": after_native - after_python,
            "kinds": kinds, "kinds_after_again": native.loaded().kinds()}


def funcol_and_recorder(rank: int, world: int) -> dict[str, Any]:
    """A compiled-code op (annotated by its own Python kernel; its c10d launch below is not
    noted again), a recorder open across a capture (the native kernel stands aside), a fake
    tensor (tracing: nothing noted)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _start()
    pg = dist.group.WORLD
    _captured(11, lambda: None)
    funcol = torch.ops._c10d_functional

    def compiled() -> None:
        funcol.wait_tensor.default(funcol.all_reduce_.default(torch.ones(4), "sum",
                                                              pg.group_name))

    before = _noted()
    funcol_entries = _captured(11, compiled)
    funcol_noted = _noted() - before

    with autoannot.record(dispatcher=True) as records:
        before = _noted()
        recorded_entries = _captured(11, lambda: pg.allreduce([torch.ones(4)]).wait())
        recorder_noted = _noted() - before
    with FakeTensorMode():
        fake = torch.ones(4)
    before = _noted()

    def traced() -> None:
        with contextlib.suppress(Exception):  # a fake tensor does not run; not noted either
            pg.allreduce([fake])

    fake_entries = _captured(11, traced)
    return {"funcol": funcol_entries, "funcol_noted": funcol_noted,
            "recorded": [r.api for r in records], "recorder_entries": recorded_entries,
            "recorder_noted": recorder_noted, "fake_entries": fake_entries,
            "fake_noted": _noted() - before}


def _python_api_launches(pg: Any, rank: int, world: int) -> None:
    """Python-API launches the proxies hand to the kernel: nested ones (in torch 2.13
    ``all_gather_into_tensor`` calls ``all_gather_single``, wrapped too), a coalescing block
    (its proxies annotate it: one launch), and calls that launch nothing."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.arange(8, dtype=torch.float32) + rank
    dist.all_gather_into_tensor(torch.zeros(8 * world), x)
    dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * world))
    dist.all_to_all_single(torch.zeros(2 * world), torch.ones(2 * world))
    with dist.distributed_c10d._coalescing_manager(pg):
        dist.all_reduce(torch.ones(3))
        dist.all_reduce(torch.ones(5))
    with contextlib.suppress(ValueError, RuntimeError, TypeError):
        dist.all_reduce(x, op="no such op")  # raises before any launch (RAISING_LINE)
    pg.allreduce([torch.ones(2)]).wait()  # C++-origin: not labelled by the call that failed
    with FakeTensorMode():
        fake = torch.ones(4)
    with contextlib.suppress(Exception):
        dist.all_reduce(fake)  # tracing: nothing launches, nothing noted
    pg.allreduce([torch.ones(6)]).wait()
    dist.all_reduce(x)


def python_api_handoff(rank: int, world: int) -> dict[str, Any]:
    import inspect

    source, first = inspect.getsourcelines(_python_api_launches)
    raising = first + next(i for i, line in enumerate(source) if "(RAISING_LINE)" in line)
    _start()
    pg = dist.group.WORLD
    _captured(0, lambda: None)
    before = _noted()
    python = _captured(0, lambda: _python_api_launches(pg, rank, world))
    after_python = _noted()
    noted = _captured(11, lambda: _python_api_launches(pg, rank, world))
    after_native = _noted()
    module = native.loaded()
    x = torch.ones(4)
    with autoannot.record() as records:  # a recorder open: no handing off
        recorded = _captured(11, lambda: dist.all_reduce(x))
    return {"python": python, "native": noted, "noted_by_python_run": after_python - before,
            "raising_line": f"{__file__}:{raising}",
            "noted_by_native_run": after_native - after_python,
            "recorded": [r.api for r in records], "recorded_entries": recorded,
            "noted_with_recorder": _noted() - after_native,
            "handoff_after": module.handoff(), "armed_after": module.armed()}


def op_without_native_kernel(rank: int, world: int) -> dict[str, Any]:
    """``c10d::broadcast_`` left without a native kernel: ``dist.broadcast`` handed off is
    noted after its call by the Python side, as its wrapper would have."""
    from autoannot import dispatch

    register = dispatch.DispatcherLayer._register_native
    dispatch.DispatcherLayer._register_native = (  # type: ignore[method-assign]
        lambda self, ops: register(self, [op for op in ops if op != "c10d::broadcast_"]))
    _start()

    def body() -> None:
        dist.all_reduce(torch.ones(4))
        dist.broadcast(torch.ones(6, dtype=torch.float16), 1)
        dist.all_reduce(torch.ones(4))

    _captured(0, lambda: None)
    python = _captured(0, body)
    before = _noted()
    noted = _captured(11, body)
    return {"python": python, "native": noted, "noted": _noted() - before,
            "registered": native.loaded().registered()}


def group_lifetime(rank: int, world: int) -> dict[str, Any]:
    """A group whose launches the kernel noted is freed once destroyed (its backend's threads
    stop), as with the agent off; its kinds are forgotten at once, and launches noted before
    keep theirs."""
    import gc
    import os
    import time

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    _start()
    module = native.loaded()
    _captured(11, lambda: None)
    base = threads()
    group = dist.new_group(list(range(world)))
    with_group = threads()
    entries = _captured(11, lambda group=group: group.allreduce([torch.ones(2)]).wait())
    kinds = module.kinds()
    dist.destroy_process_group(group)
    del group
    gc.collect()
    for _ in range(50):  # (its threads are joined as it is freed)
        if threads() <= base:
            break
        time.sleep(0.1)
    after, kinds_after = threads(), module.kinds()
    # a group gone while a capture is in progress: launches noted before it keep their kind
    pg = dist.group.WORLD
    _captured(11, lambda: pg.allreduce([torch.ones(3)]).wait())  # the kind known, derived
    other = [dist.new_group(list(range(world)))]

    def body() -> None:
        pg.allreduce([torch.ones(3)]).wait()  # of the kind known
        dist.destroy_process_group(other.pop())
        gc.collect()  # (the kernel forgets its kinds)
        pg.allreduce([torch.ones(3)]).wait()  # a new kind, the same metadata

    across = _captured(11, body)
    return {"base": base, "with_group": with_group, "after": after, "kinds": kinds,
            "kinds_after": kinds_after, "entries": [e["api"] for e in entries],
            "across": [(e["api"], e["annotation"]["Process Group Name"],
                        e["annotation"]["In msg nelems"]) for e in across],
            "world_name": pg.group_name}


def ddp_steps(rank: int, world: int) -> dict[str, Any]:
    """DDP's reducer (a C++-origin launch per bucket) in captured steps."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.02)
    _start()
    data = torch.randn(8, 64)

    def step() -> None:
        ddp(data).sum().backward()

    for _ in range(2):  # DDP rebuilds its buckets after the first step
        step()
    _captured(0, lambda: None)
    before = _noted()
    python_kernels = _captured(0, step)
    noted = _captured(11, step)
    return {"python": python_kernels, "native": noted, "noted": _noted() - before}


def layer_state(rank: int, world: int) -> dict[str, Any]:
    """disable() takes the native kernels off; enable() and the next capture put them back."""
    import torch._C as C

    _start()
    pg = dist.group.WORLD
    first = _captured(11, lambda: pg.allreduce([torch.ones(2)]).wait())
    on = C._dispatch_has_kernel_for_dispatch_key("c10d::allreduce_", native.loaded().KEY)
    autoannot.disable()
    off = C._dispatch_has_kernel_for_dispatch_key("c10d::allreduce_", native.loaded().KEY)
    autoannot.enable()
    again = _captured(11, lambda: pg.allreduce([torch.ones(2)]).wait())
    # launches noted under a capture no ledger claims are let go when no capture is left
    module = native.loaded()

    def elsewhere() -> None:
        module.set_test_capture(12)
        pg.allreduce([torch.ones(2)]).wait()

    orphaned = _captured(11, elsewhere)
    pending_after = module.pending()
    # a group gone: the kinds noted on it are forgotten (a new group may get its address)
    import gc

    names = []
    for _ in range(3):
        group = dist.new_group(list(range(world)))
        entries = _captured(11, lambda group=group: group.allreduce([torch.ones(2)]).wait())
        names.append((entries[0]["annotation"]["Process Group Name"], group.group_name))
        dist.destroy_process_group(group)
        del group, entries
        gc.collect()
    return {"first": first, "again": again, "on": on, "off": off, "group_names": names,
            "orphaned": orphaned, "pending_after": pending_after,
            "included_after": C._dispatch_tls_is_dispatch_key_included(
                C._dispatch_key_parse(native.loaded().KEY))}

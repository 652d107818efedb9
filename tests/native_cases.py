"""What each rank runs for test_native.py: the native observer (torch's RecordFunction
callbacks) on real gloo groups.

There is no CUDA here: a capture is what ``CUDAGraph.capture_begin``/``capture_end``'s wrappers
see (on a stand-in graph, ``autoannot.testing.stand_in``), and the observer is told which
capture every launch goes into (``set_test_capture``), as CUDA would tell it. gloo makes no
record of its launches (``record_param_comms``): captures here ask for the operators' inputs
(``set_capture_inputs``), which on NCCL they need not; ``launch_as_nccl`` makes a launch that
records itself as ProcessGroupNCCL does.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import agent_hooks as hooks
import torch
import torch.distributed as dist

import autoannot
from autoannot import testing
from autoannot.describe import vocabulary as V


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


def _entries(graph: Any) -> list[dict[str, Any]]:
    return [{"api": e["api"], "annotation": e["annotation"], "kernels": e["kernels"],
             "call_site": e["call_site"]} for e in hooks.ledger(graph).entries]


def _captured(test_capture: int, body: Any) -> list[dict[str, Any]]:
    """The ledger of one stand-in capture of ``body()``; ``test_capture``: the capture id the
    observer is told (0: none, as on a CPU)."""
    with testing.stand_in(test_capture) as graph:
        body()
    return _entries(graph)


def _start(inputs: bool = True) -> Any:
    """The agent on, its native observer loaded (captures asking for inputs: gloo makes no
    record of its launches); a launch's capture is its thread's."""
    hooks.AGENT.captures.by_thread()
    autoannot.enable()
    import torch.distributed._functional_collectives  # noqa: F401  (its proxies)

    observer = hooks.AGENT.observer
    assert observer is not None, "the native observer is not loaded"
    observer.module.set_capture_inputs(inputs)
    return observer.module


def _records(records: list[Any]) -> list[dict[str, Any]]:
    return [{"api": r.api, "annotation": r.annotation, "call_site": r.call_site}
            for r in records]


def mixed_launches(rank: int, world: int) -> dict[str, Any]:
    """The same launches captured (noted in C++) and recorded (told to Python at once)."""
    module = _start()
    pg = dist.group.WORLD
    sub = dist.new_group([r for r in range(world) if r % 2 == 0])
    sub = sub if rank % 2 == 0 else None
    registered_idle = module.registered()
    with autoannot.record() as records:
        registered_recording = module.registered()
        _launches(pg, sub, rank, world)
    before = module.noted()
    noted = _captured(11, lambda: _launches(pg, sub, rank, world))
    noted_count = module.noted() - before
    kinds = module.kinds()
    again = _captured(11, lambda: _launches(pg, sub, rank, world))  # each kind derived once
    return {"recorded": _records(records), "noted": noted, "again": again,
            "noted_count": noted_count, "kinds": kinds, "kinds_after_again": module.kinds(),
            "registered": [registered_idle, registered_recording, module.registered()]}


def python_api_handoff(rank: int, world: int) -> dict[str, Any]:
    """Python-API launches in a capture, handed to the observer by their proxies: nested ones
    (torch 2.13's ``all_gather_into_tensor`` calls ``all_gather_single``, wrapped too), a
    coalescing block (its proxies annotate it: one launch), calls that launch nothing."""
    import inspect

    from torch._subclasses.fake_tensor import FakeTensorMode

    def body() -> None:
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

    source, first = inspect.getsourcelines(body)
    raising = first + next(i for i, line in enumerate(source) if "(RAISING_LINE)" in line)
    module = _start()
    pg = dist.group.WORLD
    with autoannot.record() as records:
        body()
    before = module.noted()
    noted = _captured(11, body)
    noted_count = module.noted() - before
    with autoannot.record() as recorded:  # a recorder open: no handing off
        with_recorder = _captured(11, lambda: dist.all_reduce(torch.ones(4)))
    return {"recorded": _records(records), "noted": noted, "noted_count": noted_count,
            "raising_line": f"{__file__}:{raising}",
            "with_recorder": with_recorder, "recorded_apis": [r.api for r in recorded],
            "handoff_after": module.handoff()}


def work_ranges_only(rank: int, world: int) -> dict[str, Any]:
    """Captures as the agent runs them (no operator's inputs asked for): gloo makes no record
    of a launch, so C++-origin launches go unnoted; the Python API's proxies hand theirs off,
    get them back un-noted, and note them after the call."""
    module = _start(inputs=False)
    pg = dist.group.WORLD

    def body() -> None:
        dist.all_reduce(torch.ones(4))
        pg.allreduce([torch.ones(5)]).wait()
        dist.broadcast(torch.ones(6, dtype=torch.float16), 1)

    before = module.noted()
    entries = _captured(11, body)
    return {"entries": entries, "noted": module.noted() - before,
            "demand_in_capture": list(_demand_in(module, 11))}


def keyed_by_proxies(rank: int, world: int) -> dict[str, Any]:
    """Python-API launches in a capture, keyed and noted by their proxies' C wrappers (no
    Python frame, no Work range): each gets what the table derives for that very call, across
    dtypes, sizes, the default group (as None and named), a subgroup, roots, keyword and
    positional arguments and a Parameter; a call that raises is not noted; what the wrappers
    keep goes with a group that is gone."""
    import gc
    import inspect

    from autoannot.helper import describe_call

    module = _start(inputs=False)
    pg = dist.group.WORLD
    sub = dist.new_group(list(range(world)), group_desc="sub")
    calls = [
        (dist.all_reduce, (torch.ones(4),), {}),
        (dist.all_reduce, (torch.ones(4, dtype=torch.float16),), {}),
        (dist.all_reduce, (torch.ones(5),), {"group": pg}),
        (dist.all_reduce, (torch.ones(4),), {"group": sub}),
        (dist.all_reduce, (torch.ones(4), dist.ReduceOp.MAX, sub), {}),
        (dist.all_reduce, (torch.nn.Parameter(torch.ones(3), requires_grad=False),), {}),
        (dist.broadcast, (torch.ones(3), 0), {}),
        (dist.broadcast, (torch.ones(3), 1), {}),
        (dist.broadcast, (torch.ones(3),), {"src": 1, "group": sub}),
        (dist.all_gather_into_tensor, (torch.zeros(4 * world), torch.ones(4)), {}),
        (dist.reduce_scatter_tensor, (torch.zeros(2), torch.ones(2 * world)), {}),
        (dist.reduce, (torch.ones(6, dtype=torch.int64), 1), {}),
    ]
    expected = [[f.__name__, describe_call(f, *a, **k)] for f, a, k in calls]

    def body() -> None:
        for function, args, kwargs in calls:
            function(*args, **kwargs)  # (CALL_LINE)
        with contextlib.suppress(ValueError, RuntimeError, TypeError):
            dist.all_reduce(torch.ones(4), op="no such op")  # raises before any launch

    source, first = inspect.getsourcelines(body)
    line = first + next(i for i, text in enumerate(source) if "(CALL_LINE)" in text)
    before = module.noted()
    first_time = _captured(11, body)
    again = _captured(11, body)  # from what the wrappers kept
    noted = module.noted() - before
    kept = module.handed_known()
    dist.destroy_process_group(sub)
    calls.clear()
    del sub, body
    gc.collect()
    return {"expected": expected, "noted": noted, "kept": kept,
            "kept_after_group_gone": module.handed_known(),
            "first": [[e["api"], e["annotation"]] for e in first_time],
            "again": [[e["api"], e["annotation"]] for e in again],
            "sites": sorted({e["call_site"] for e in first_time + again}),
            "call_line": f"{__file__}:{line}"}


def _demand_in(module: Any, test_capture: int) -> tuple[Any, bool]:
    with testing.stand_in(test_capture):
        return module.demand(), module.registered()


def as_nccl(rank: int, world: int) -> dict[str, Any]:
    """Launches that record themselves as ProcessGroupNCCL's do: what the observer notes in a
    capture (from torch's record, no operator asked for) against what torch's profiler writes
    on the same record (``record_param_comms``)."""
    import json
    import os
    import tempfile

    module = _start(inputs=False)
    cases = [  # (op, group name, desc, collective, rank, in, out, dtype, splits, start, stride,
        #      size): a strided group, a one-rank subgroup, a group not strided, a send to a
        #      peer, an all-to-all with splits, a group of 40 ranks (truncated)
        ("c10d::allreduce_", "3", "tp", "allreduce", 1, 8, 8, torch.bfloat16, [], [], 2, 2, 4),
        ("c10d::allreduce_", "1", "undefined", "allreduce", 0, 5, 5, torch.float32, [], [],
         0, 0, 1),
        ("c10d::_allgather_base_", "2", "odd", "_allgather_base", 1, 4, 12, torch.float16, [],
         [], 0, -1, 3),
        ("c10d::send", "0", "default_pg", "send", 1, 6, 6, torch.float32, [], [], 0, 1, 2),
        ("c10d::alltoall_base_", "0", "default_pg", "all_to_allv", 0, 6, 6, torch.int64,
         [1, 5], [2, 4], 0, 1, 2),
        ("c10d::allreduce_", "5", "wide", "allreduce", 3, 2, 2, torch.float32, [], [], 0, 1, 40),
    ]

    def body() -> None:
        for op, *fields in cases:
            module.launch_as_nccl(op, *fields)

    with testing.stand_in(11) as graph:
        body()
    noted = _entries(graph)
    with autoannot.record() as records:  # the recorders' path: operators asked for
        body()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        body()
    from autoannot.keep.journal import Journal

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        journal = Journal(os.path.join(folder, "records.jsonl"))  # AUTOANNOT_RECORD's file
        # (as on a torch with NCCL, whose groups record themselves: the Work ranges suffice)
        hooks.AGENT.observer._needs_operators = False
        hooks.AGENT.state.open_journal(journal)
        journal_registered = module.demand(), module.registered()
        try:
            body()
        finally:
            hooks.AGENT.state.close_journal(journal)
            journal.close()
        with open(journal.path) as f:
            lines = [json.loads(line) for line in f]
    torch_records = [e["args"] for e in sorted(events, key=lambda e: e["ts"])
                     if e.get("name") == "record_param_comms"]
    return {"noted": noted, "recorded": [{"api": r.api, "annotation": r.annotation,
                                          "param_comms": r.param_comms} for r in records],
            "journal": [{"api": line["api"], "param_comms": line["param_comms"],
                         "call_site": line["call_site"]} for line in lines],
            "journal_registered": journal_registered,
            "torch": [{k: v for k, v in a.items() if k in V.KERNEL_KEYS + V.CPU_ONLY_KEYS}
                      for a in torch_records]}


def ddp_steps(rank: int, world: int) -> dict[str, Any]:
    """DDP's reducer (a C++-origin launch per bucket, from autograd's engine) recorded by a
    plain ``record()`` and captured."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.02)
    module = _start()
    data = torch.randn(8, 64)

    def step() -> None:
        ddp(data).sum().backward()

    for _ in range(2):  # DDP rebuilds its buckets after the first step
        step()
    with autoannot.record() as records:
        step()
    with autoannot.record(python_api_only=True) as python_only:
        step()
    before = module.noted()
    noted = _captured(11, step)
    import tempfile

    from autoannot.keep.ring import Ring
    from autoannot.traces.read import ring_files

    with tempfile.TemporaryDirectory() as folder:  # a ring (as on a GPU host: a record file
        hooks.AGENT.observer._needs_operators = False  # there would ask for no operator)
        module.set_capture_inputs(False)  # (no capture here: as a job's observer)
        ring = Ring(folder, 64)
        hooks.AGENT.state.open_journal(ring)
        try:
            step()
        finally:
            hooks.AGENT.state.close_journal(ring)
            ring.close()
        kept = ring_files.read(Path(ring.ring_path)) if ring.ring_path else None
    ringed = [] if kept is None else [kept.kinds[int(k)]["api"] for k in kept.records["kind"]]
    return {"recorded": _records(records), "python_only": len(python_only),
            "noted": noted, "noted_count": module.noted() - before,
            "parameters": sum(p.numel() for p in model.parameters()), "ringed": ringed}


def no_python_caller(rank: int, world: int) -> dict[str, Any]:
    """A launch from a thread with no Python frame at all (as autograd's device threads run
    DDP's reducer on a GPU): recorded, its call site saying so."""
    import _thread
    import time

    _start()
    pg = dist.group.WORLD
    with autoannot.record() as records:
        # the thread runs pg.allreduce itself (C calls C): no Python frame on it
        _thread.start_new_thread(pg.allreduce, ([torch.ones(3)],))
        deadline = time.monotonic() + 30
        while not records and time.monotonic() < deadline:
            time.sleep(0.01)
    pg.barrier().wait()  # (after the thread's launch on every rank: the same order)
    with autoannot.record() as from_python:
        pg.allreduce([torch.ones(4)]).wait()
    return {"records": [(r.api, r.annotation[V.IN_NELEMS], r.call_site)
                        for r in [*records, *from_python]]}


def group_lifetime(rank: int, world: int) -> dict[str, Any]:
    """A group whose launches the observer noted is freed once destroyed (its backend's threads
    stop), as with the agent off; its kinds are forgotten at once, and launches noted before
    keep theirs."""
    import gc
    import os
    import time

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    module = _start()
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
    pg = dist.group.WORLD
    _captured(11, lambda: pg.allreduce([torch.ones(3)]).wait())  # the kind known, derived
    other = [dist.new_group(list(range(world)))]

    def body() -> None:
        pg.allreduce([torch.ones(3)]).wait()  # of the kind known
        dist.destroy_process_group(other.pop())
        gc.collect()  # (the observer forgets its kinds)
        pg.allreduce([torch.ones(3)]).wait()  # a new kind, the same metadata

    across = _captured(11, body)
    # a recorder's launch on a group: its kind lets the group go once Python knows it
    third = dist.new_group(list(range(world)))
    with autoannot.record():
        third.allreduce([torch.ones(5)]).wait()
    holding_after_record = module.kinds_holding_arguments()
    dist.destroy_process_group(third)
    return {"base": base, "with_group": with_group, "after": after, "kinds": kinds,
            "holding_after_record": holding_after_record,
            "kinds_after": kinds_after, "entries": [e["api"] for e in entries],
            "across": [(e["api"], e["annotation"][V.PG_NAME], e["annotation"][V.IN_NELEMS])
                       for e in across],
            "world_name": pg.group_name}


def observer_state(rank: int, world: int) -> dict[str, Any]:
    """The callback registered only while something asks; disable() and enable(); the borrowed
    dispatch key never touched."""
    import torch._C as C

    module = _start(inputs=False)
    pg = dist.group.WORLD
    key = C._dispatch_key_parse("DeferredInit")
    seen: dict[str, Any] = {"idle": (module.registered(), module.demand())}
    with autoannot.record(python_api_only=True):
        seen["record(python_api_only=True)"] = (module.registered(), module.demand())
    with autoannot.record():
        seen["record()"] = (module.registered(), module.demand())
    seen["capture"] = list(_demand_in(module, 11))
    seen["after"] = (module.registered(), module.demand())
    module.set_capture_inputs(True)
    first = _captured(11, lambda: pg.allreduce([torch.ones(2)]).wait())
    autoannot.disable()
    with autoannot.record():
        seen["record() with the agent off"] = (module.registered(), module.demand())
    autoannot.enable()
    again = _captured(11, lambda: pg.allreduce([torch.ones(2)]).wait())

    def elsewhere() -> None:  # launches under a capture no ledger claims: let go at the end
        module.set_test_capture(12)
        pg.allreduce([torch.ones(2)]).wait()

    orphaned = _captured(11, elsewhere)
    seen["pending after"] = module.pending()
    seen["DeferredInit: a fallback, included"] = (C._dispatch_has_backend_fallback(key),
                                                  C._dispatch_tls_is_dispatch_key_included(key))
    seen["layer made"] = hooks.AGENT.layer is not None
    return {"seen": seen, "first": first, "again": again, "orphaned": orphaned}


def many_kinds(rank: int, world: int) -> dict[str, Any]:
    """A job whose sizes keep changing (MoE all-to-all): more kinds than the observer keeps
    (a small ``CACHE_SIZE`` here). What C++ and Python hold stays bounded, old kinds are let
    go (counted), and every launch is still recorded right — sizes seen before, after their
    kind was let go, included."""
    from autoannot.observe import native_observer

    _start()
    agent_observer = hooks.AGENT.observer
    native_observer.CACHE_SIZE = 32
    pg = dist.group.WORLD
    sizes = [*range(1, 201), *range(1, 41)]
    most_in_cpp = most_in_python = 0
    with autoannot.record() as records:
        for n in sizes:
            pg.allreduce([torch.ones(n)]).wait()
            most_in_cpp = max(most_in_cpp, agent_observer.module.kinds())
            most_in_python = max(most_in_python, len(agent_observer._kinds))
    return {"recorded": [r.annotation[V.IN_NELEMS] for r in records], "sizes": sizes,
            "most_in_cpp": most_in_cpp, "most_in_python": most_in_python,
            "let_go": agent_observer.kinds_let_go}


def _line_below() -> int:
    """The line after the caller's: where the call the test plants is."""
    import sys

    return sys._getframe(1).f_lineno + 1


def proxies_ring(rank: int, world: int, folder: str) -> dict[str, Any]:
    """The always-on ring (opened before ``enable()``, as ``AUTOANNOT_RING`` opens it) around
    Python-API launches, each at a line the case knows: three steps of five calls on two groups
    (one async), one on another thread, then a call that raises in the process group with a
    key seen before (a bitwise AND of floats, the size of a launch seen). The ring's records
    are read back."""
    import threading

    from autoannot.agent.instrumentation import INSTRUMENTATION
    from autoannot.keep.ring import Ring
    from autoannot.traces.read import ring_files

    ring = Ring(folder)
    INSTRUMENTATION.state.open_journal(ring)
    autoannot.enable()
    module = INSTRUMENTATION.proxies_native_module()
    sub = dist.new_group(list(range(world)))
    x = torch.ones(2, 8) + rank
    lines: list[int] = []
    written_before = module.proxies_written() if module is not None else 0
    for _ in range(3):
        lines.append(_line_below())
        dist.all_reduce(x)
        lines.append(_line_below())
        dist.all_gather_into_tensor(torch.empty(2 * world, 8), x)
        lines.append(_line_below())
        dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * world))
        lines.append(_line_below())
        dist.broadcast(torch.ones(5, dtype=torch.float64), src=world - 1, group=sub)
        lines.append(_line_below())
        work = dist.all_reduce(torch.ones(6, dtype=torch.int32), group=sub, async_op=True)
        work.wait()
    elsewhere = threading.Thread(target=_all_reduce_elsewhere, args=(x, lines))
    elsewhere.start()  # (a key seen, from another thread: its line there)
    elsewhere.join()
    written = (module.proxies_written() if module is not None else 0) - written_before
    lines.append(_line_below())
    raised = _raised(lambda: dist.all_reduce(x, op=dist.ReduceOp.BAND))
    inside_after = dict(INSTRUMENTATION.state.inside)
    written_all = (module.proxies_written() if module is not None else 0) - written_before
    path = ring.ring_path
    INSTRUMENTATION.state.close_journal(ring)
    ring.close()
    autoannot.disable()
    raised_off = _raised(lambda: dist.all_reduce(x, op=dist.ReduceOp.BAND))
    read = ring_files.read(Path(path))
    return {
        "native": module is not None, "written": written, "written_all": written_all,
        "lines": lines, "file": __file__, "raised": raised, "raised_off": raised_off,
        "inside_after": inside_after, "work": type(work).__name__,
        "world_group": dist.distributed_c10d._get_process_group_name(dist.group.WORLD),
        "sub": dist.distributed_c10d._get_process_group_name(sub),
        "launches": [(launch.group, launch.seq, launch.collective, launch.size_bytes,
                      launch.call_site) for launch in ring_files.launches_of(read)],
        "returned": [int(r) for r in read.records["returned_ns"]],
        "entered": [int(e) for e in read.records["entered_ns"]],
    }


def _all_reduce_elsewhere(x: Any, lines: list[int]) -> None:
    lines.append(_line_below())
    dist.all_reduce(x)


def _raised(call: Any) -> list[str] | None:
    """What ``call()`` raised: its type's name and message (None if it returned)."""
    try:
        call()
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    return None


def ring_below_the_python_api(rank: int, world: int, folder: str) -> dict[str, Any]:
    """The always-on ring (opened before ``enable()``, as ``AUTOANNOT_RING`` opens it) around
    what no proxy sees, each at a line the case knows: three steps of DDP (its reducer's
    bucket all-reduces, from C++), ``pg.allreduce`` and a proxied ``dist.all_reduce``; a
    ``pg.allreduce`` on another thread, one on a second group, a ``pg.allgather`` that raises in
    gloo, one with a recorder open. DDP's own account of its buckets (its logging data) is the
    truth of what a backward launches; the ring's records are read back from its files."""
    import threading

    from autoannot.agent.instrumentation import INSTRUMENTATION
    from autoannot.keep.ring import Ring
    from autoannot.traces.read import ring_files

    ring = Ring(folder)
    INSTRUMENTATION.state.open_journal(ring)
    autoannot.enable()
    observer = INSTRUMENTATION.observer
    module = observer.module if observer is not None else None
    group = dist.new_group(list(range(world)))
    other = dist.new_group(list(range(world)))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]), process_group=group,
        bucket_cap_mb=0.02)
    for _ in range(2):  # (DDP rebuilds its buckets after its first step)
        model(torch.ones(2, 64)).sum().backward()
    before = ring.count
    written_before = module.ring_kernel_counts()[0] if module is not None else 0
    lines: dict[str, int] = {}
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
    lines["raised"] = _line_below()
    raised = _raised(lambda: group.allgather([[torch.ones(2)]], [torch.ones(2)]))
    written = (module.ring_kernel_counts()[0] if module is not None else 0) - written_before
    operators_watched = module.registered() if module is not None else None
    with autoannot.record() as recorded:  # (the operators' callback's, meanwhile)
        lines["recorded"] = _line_below()
        group.allreduce([torch.ones(3)]).wait()
    path, count = ring.ring_path, ring.count
    INSTRUMENTATION.state.close_journal(ring)
    ring.close()
    autoannot.disable()
    raised_off = _raised(lambda: group.allgather([[torch.ones(2)]], [torch.ones(2)]))
    buckets = model._get_ddp_logging_data()["rebuilt_bucket_sizes"]
    read = ring_files.read(Path(path))
    return {
        "native": module is not None, "written": written, "count": count, "before": before,
        "operators_watched": operators_watched,
        "kernel_after_disable": torch._C._dispatch_has_kernel_for_dispatch_key(
            "c10d::allreduce_", "BackendSelect"),
        "raised": raised, "raised_off": raised_off,
        "recorded": [(r.annotation.get(V.IN_NELEMS), r.call_site) for r in recorded],
        "bucket_bytes": sorted(int(size) for size in buckets.split(",")),
        "lines": lines, "file": __file__,
        "group": dist.distributed_c10d._get_process_group_name(group),
        "other": dist.distributed_c10d._get_process_group_name(other),
        "launches": [(launch.group, launch.seq, launch.collective, launch.size_bytes,
                      launch.call_site) for launch in ring_files.launches_of(read)],
        "returned": [int(r) for r in read.records["returned_ns"]],
        "entered": [int(e) for e in read.records["entered_ns"]],
    }


def ring_beside_a_kernel_of_anothers(rank: int, world: int, folder: str) -> dict[str, Any]:
    """The always-on ring where another library has a kernel on ``c10d::allreduce_`` at torch's
    ``BackendSelect`` key (registered first, as a library's would be when it loads): the c10d
    kernels step aside, said once, and the operators' callback keeps the ring, as before."""
    import warnings

    from autoannot.agent.instrumentation import INSTRUMENTATION
    from autoannot.keep.ring import Ring
    from autoannot.traces.read import ring_files

    below = torch._C._dispatch_keyset_full_after(torch._C._dispatch_key_parse("BackendSelect"))
    op = torch.ops.c10d.allreduce_.default
    theirs: list[int] = []

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        theirs.append(1)
        return op.redispatch(keyset & below, *args, **kwargs)

    library = torch.library.Library("c10d", "IMPL")
    library.impl("allreduce_", kernel, "BackendSelect", with_keyset=True)
    ring = Ring(folder)
    INSTRUMENTATION.state.open_journal(ring)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        autoannot.enable()
        module = INSTRUMENTATION.observer.module
        lines = []
        for _ in range(3):
            lines.append(_line_below())
            dist.group.WORLD.allreduce([torch.ones(3)]).wait()
        kernels, watched = module.ring_kernels(), module.registered()
    path = ring.ring_path
    INSTRUMENTATION.state.close_journal(ring)
    ring.close()
    autoannot.disable()
    launches = [] if path is None else ring_files.launches_of(ring_files.read(Path(path)))
    return {"kernels": kernels, "watched": watched, "theirs": len(theirs), "lines": lines,
            "file": __file__, "said": [str(w.message) for w in said],
            "launches": [(launch.collective, launch.size_bytes, launch.call_site)
                         for launch in launches]}

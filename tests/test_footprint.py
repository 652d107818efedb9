"""What the agent changes in a user's process: nothing they can notice — pickling and copies,
the dispatcher when nothing is annotated (with other threads alive), what torch.compile guards
on, the capture, replay, export and disable steps, ledgers over a long job, exceptions, call
sites, fork."""

from __future__ import annotations

import copy
import functools
import os
import pickle
import subprocess
import sys
import threading
import time
from typing import Any

import agent_hooks as hooks
import pytest
import torch
import torch.distributed as dist
import wrapt
from harness import run_ranks

import autoannot
from autoannot.agent import patching
from autoannot.describe import collectives
from autoannot.keep import captures

# --- pickling and copies --------------------------------------------------------------------


def _wrapped_functions() -> dict[str, Any]:
    """Every collective of the table the agent replaces in a module, as that module holds it."""
    import importlib

    found = {}
    for row in collectives.COLLECTIVES:
        if row.module not in collectives.FUNCTION_MODULES:
            continue
        module = importlib.import_module(row.module)
        if row.api in module.__dict__:
            found[f"{row.module}.{row.api}"] = module.__dict__[row.api]
    return found


def test_collectives_pickle_and_copy_as_with_the_agent_off() -> None:
    """``pickle``, ``copy`` and ``deepcopy`` of every wrapped collective, and of partials over
    one (made before and after ``enable()``): the same bytes and objects as with the agent
    off, and the bytes load (to what the module holds)."""
    import torch.distributed._functional_collectives  # noqa: F401

    autoannot.disable()
    originals = _wrapped_functions()
    assert len(originals) >= 25
    off = {name: pickle.dumps(f) for name, f in originals.items()}
    off_partial = {name: pickle.dumps(functools.partial(f, 7)) for name, f in originals.items()}
    made_before = {name: functools.partial(f, 7) for name, f in originals.items()}
    autoannot.enable()
    try:
        current = _wrapped_functions()
        assert all(current[n] is not originals[n] for n in current)  # proxies in place
        for name, proxy in current.items():
            assert pickle.dumps(proxy) == off[name], name
            assert pickle.loads(off[name]) is proxy, name
            assert copy.copy(proxy) is proxy and copy.deepcopy(proxy) is proxy, name
            assert copy.deepcopy({"f": proxy})["f"] is proxy, name
            assert pickle.dumps(functools.partial(proxy, 7)) == off_partial[name], name
            assert pickle.dumps(made_before[name]) == off_partial[name], name
            assert copy.deepcopy(made_before[name]).args == (7,), name
    finally:
        autoannot.disable()
    for name, f in made_before.items():  # and after disable(), as before enable()
        assert pickle.dumps(f) == off_partial[name], name


# --- the dispatcher when nothing is annotated ------------------------------------------------


#: What of the agent runs on every collective where torch's process groups take hooks (>=
#: 2.14): its two hooks, which return at once while nothing asks (they cannot be taken off
#: while other threads may issue collectives: ``group_hooks``).
IDLE_HOOKS = {("group_hooks.py", "_before"), ("group_hooks.py", "_after")}


def _agent_code_runs(call: Any) -> bool:
    """Whether any function of autoannot runs during ``call()`` (on this thread), but the
    process groups' idle hooks, which run nothing more."""
    ran: list[str] = []
    root = os.path.dirname(autoannot.__file__)

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(root):
            ran.append((os.path.basename(frame.f_code.co_filename), frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return bool(set(ran) - IDLE_HOOKS) or len(ran) > len(IDLE_HOOKS)


def idle_after_annotating(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed import _functional_collectives as funcol

    ops = torch.ops._c10d_functional
    pg = dist.group.WORLD
    calls = {
        "pg.allreduce": lambda: pg.allreduce([torch.ones(4)]).wait(),
        "funcol op": lambda: ops.wait_tensor(ops.all_reduce(torch.ones(4), "sum", "0")),
        "dist.all_reduce": lambda: dist.all_reduce(torch.ones(4)),
        "funcol.all_reduce": lambda: funcol.all_reduce(torch.ones(4), "sum", pg).wait(),
    }
    stop = threading.Event()
    helpers = [threading.Thread(target=stop.wait) for _ in range(2)]  # idle threads, alive
    for helper in helpers:
        helper.start()
    seen: dict[str, Any] = {}
    autoannot.enable()
    try:
        with autoannot.record() as records:
            for call in calls.values():
                call()
        seen["recorded"] = len(records)
        seen["after record()"] = [n for n, call in calls.items() if _agent_code_runs(call)]
        graph = type("Graph", (), {})()  # what CUDAGraph.capture_begin's wrapper sees
        hooks.begin_capture(lambda: None, graph, (), {})
        with autoannot.record() as records:
            calls["pg.allreduce"]()  # from C++ code, in a capture: annotated
        hooks.end_capture(lambda: None, graph, (), {})
        seen["captured"] = [r.api for r in records]
        seen["after a capture"] = [n for n, call in calls.items() if _agent_code_runs(call)]
    finally:
        autoannot.disable()
        stop.set()
        for helper in helpers:
            helper.join()
    return seen


def test_nothing_of_the_agent_runs_when_nothing_is_annotated_whatever_the_threads() -> None:
    """Two idle threads alive: after a ``record()`` and after a capture, no code of the agent
    runs on a collective's launch (no Python kernel below any of them)."""
    (seen,) = run_ranks(idle_after_annotating, 2, "fake", ranks=(0,))
    # record() sees every launch (the four); a capture the C++-origin one too.
    assert seen == {"recorded": 4, "after record()": [], "captured": ["c10d.allreduce_"],
                    "after a capture": []}


def compile_from_threads(rank: int, world: int, python_api_only: bool) -> dict[str, Any]:
    compiled_frames: list[int] = []

    def counting_backend(gm: Any, example_inputs: Any) -> Any:
        compiled_frames.append(1)
        return gm.forward

    @torch.compile(backend=counting_backend)
    def step(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum()

    autoannot.enable()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(3):
                step(torch.ones(4))
                with autoannot.record(python_api_only=python_api_only):
                    step(torch.ones(4))
                    dist.all_reduce(torch.ones(4))
                step(torch.ones(4))
        except BaseException as exc:
            errors.append(exc)

    step(torch.ones(4))
    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    work()
    which = ("group hooks" if hooks.AGENT.hooks is not None else
             "native observer" if hooks.AGENT.observer is not None else "python layer")
    autoannot.disable()
    return {"compiles": len(compiled_frames), "errors": [repr(e) for e in errors],
            "which": which}


@pytest.mark.parametrize("layer", ["native observer", "python layer", "group hooks"])
def test_compiled_code_is_never_recompiled_for_the_agent(layer: str, request,
                                                         monkeypatch) -> None:
    """A compiled function called from 3 threads and the main one, recorders opening and
    closing on each: compiled once. The native observer and torch's process-group hooks
    include no dispatch key, whatever a recorder sees; the Python layer includes one for a
    plain record() (its cost, said in the README), none for ``record(python_api_only=True)``."""
    from autoannot.observe import group_hooks

    monkeypatch.setenv("AUTOANNOT_GROUP_HOOKS", "1" if layer == "group hooks" else "0")
    if layer == "group hooks":
        if not group_hooks.available():
            pytest.skip("this torch's process groups take no collective hooks (torch < 2.14)")
        (seen,) = run_ranks(compile_from_threads, 2, "fake", (False,), ranks=(0,))
    elif layer == "native observer":
        build = request.getfixturevalue("native_build")
        monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(build.parent.parent))
        (seen,) = run_ranks(compile_from_threads, 2, "fake", (False,), ranks=(0,))
    else:
        monkeypatch.setenv("AUTOANNOT_NATIVE", "0")
        (seen,) = run_ranks(compile_from_threads, 2, "fake", (True,), ranks=(0,))
        (plain,) = run_ranks(compile_from_threads, 2, "fake", (False,), ranks=(0,))
        assert plain["compiles"] > 1  # the key it includes is guarded on
    assert seen == {"compiles": 1, "errors": [], "which": layer}


_ALWAYS_ON_JOB = """
import threading, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
compiled = []
def counting_backend(gm, example_inputs):
    compiled.append(1)
    return gm.forward
@torch.compile(backend=counting_backend)
def step(x):
    return (x * 2).sum()
step(torch.ones(4))
def work():
    for _ in range(3):
        step(torch.ones(4))
        dist.all_reduce(torch.ones(4))
    dist.distributed_c10d._get_default_group().allreduce([torch.ones(4)]).wait()
threads = [threading.Thread(target=work) for _ in range(3)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
work()
from autoannot.agent.instrumentation import INSTRUMENTATION
ring = next((j for j in INSTRUMENTATION.state.journals if getattr(j, "ring_path", None)), None)
print(len(compiled), -1 if ring is None else ring.count, INSTRUMENTATION.layer is not None)
"""


@pytest.mark.parametrize("layer", ["python layer", "group hooks"])
def test_an_always_on_ring_compiles_nothing_again_and_sees_every_threads_launches(
        layer: str, tmp_path) -> None:
    """The ring on from the start (``AUTOANNOT_RING``): a function compiled on the main thread
    and called from 3 threads it starts is compiled once, as with the agent off (the Python
    layer's key is held on every thread: a thread without it compiled the function again, 4
    graphs in all), and each thread's launch made from C++ (``ProcessGroup.allreduce``) is in
    the ring beside the Python API's: 4 threads x (3 + 1)."""
    from autoannot.observe import group_hooks

    if layer == "group hooks" and not group_hooks.available():
        pytest.skip("this torch's process groups take no collective hooks (torch < 2.14)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOANNOT")}
    plain = subprocess.run([sys.executable, "-c", _ALWAYS_ON_JOB], env=env, capture_output=True,
                           text=True, timeout=300)
    env.update(AUTOANNOT="1", AUTOANNOT_RING=str(tmp_path / "rings"), AUTOANNOT_NATIVE="0",
               AUTOANNOT_GROUP_HOOKS="1" if layer == "group hooks" else "0")
    done = subprocess.run([sys.executable, "-c", _ALWAYS_ON_JOB], env=env, capture_output=True,
                          text=True, timeout=300)
    assert plain.returncode == 0 == done.returncode, plain.stderr + done.stderr
    assert plain.stdout.split() == ["1", "-1", "False"]
    assert done.stdout.split() == ["1", "16", str(layer == "python layer")], done.stderr


# --- the capture, replay, export and disable steps -------------------------------------------


class _Graph:
    """What the capture wrappers see of a CUDAGraph (this machine has no CUDA)."""


def test_a_failing_agent_step_never_reaches_the_capture_or_replay(agent, monkeypatch,
                                                                  recwarn) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("agent step broke")

    graph = _Graph()
    monkeypatch.setattr(hooks.LEDGERS, "add", broken)
    assert hooks.begin_capture(lambda: "begun", graph, (), {}) == "begun"
    monkeypatch.undo()
    hooks.end_capture(lambda: None, graph, (), {})
    hooks.begin_capture(lambda: None, graph, (), {})
    monkeypatch.setattr(hooks.AGENT.captures.identity, "ended", broken)
    assert hooks.end_capture(lambda: "ended", graph, (), {}) == "ended"
    monkeypatch.undo()
    assert hooks.AGENT.state.captures == 0  # the count is right after the failure
    layer = hooks.AGENT.layer  # the Python layer (no native observer in this process)
    if layer is not None:  # not left held: the key is not included on this thread any more
        assert layer.holders == 0
        assert not torch._C._dispatch_tls_is_dispatch_key_included(
            torch._C._dispatch_key_parse("DeferredInit"))
    monkeypatch.setattr(captures, "_profiler_running", broken)
    assert hooks.replay(lambda: "replayed", graph, (), {}) == "replayed"
    said = [str(w.message) for w in recwarn if "agent step broke" in str(w.message)]
    assert len(said) == 3, said


def test_disable_runs_every_step_whatever_fails(recwarn) -> None:
    autoannot.enable()
    torch.ones(1)  # torch loaded: the patches are in place
    class Doomed(patching.Patch):
        def undo(self) -> bool:
            raise RuntimeError("undo broke")

    hooks.AGENT.patches.insert(0, Doomed(sys.modules[__name__], "_nothing", None, None))
    autoannot.disable()
    assert not autoannot.is_enabled()
    assert not isinstance(dist.all_reduce, wrapt.ObjectProxy)  # every other patch undone
    assert any("undo broke" in str(w.message) for w in recwarn)


def test_replays_are_marked_however_the_profiler_was_started(agent) -> None:
    """A profiler started below torch's Python objects (as Kineto's on-demand tracing starts
    it: no Python flag set) still gets each replay's marker."""
    from torch._C._autograd import _disable_profiler, _enable_profiler, _prepare_profiler
    from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState
    from torch.autograd.profiler import _is_profiler_enabled  # noqa: F401

    graph = _Graph()
    hooks.begin_capture(lambda: None, graph, (), {})
    hooks.end_capture(lambda: None, graph, (), {})
    config = ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False,
                            torch._C._profiler._ExperimentalConfig())
    activities = {ProfilerActivity.CPU}
    _prepare_profiler(config, activities)
    _enable_profiler(config, activities)
    assert not torch.autograd.profiler._is_profiler_enabled
    hooks.replay(lambda: torch.ones(2).sum(), graph, (), {})
    result = _disable_profiler()
    names = [event.name() for event in result.events()]
    assert f"autoannot.replay:{graph._autoannot_graph}" in names


def test_ledgers_live_as_long_as_their_graphs(agent) -> None:
    """1,000 graphs captured and freed, and one captured again 1,000 times (reset()):
    the ledgers kept stay bounded; a live graph's ledger is always there."""
    import gc

    kept = hooks.LEDGERS.KEEP_RETIRED
    start = len(hooks.LEDGERS)
    for _ in range(1000):
        graph = _Graph()
        hooks.begin_capture(lambda: None, graph, (), {})
        hooks.end_capture(lambda: None, graph, (), {})
        del graph
    gc.collect()
    assert len(hooks.LEDGERS) <= start + kept
    again = _Graph()
    for _ in range(1000):
        hooks.begin_capture(lambda: None, again, (), {})
        hooks.end_capture(lambda: None, again, (), {})
    assert len(hooks.LEDGERS) <= start + kept + 1
    assert again._autoannot_graph in hooks.LEDGERS


# --- exceptions and call sites ---------------------------------------------------------------


def _chain(exc: BaseException | None) -> list[tuple[str, str]]:
    chain = []
    while exc is not None:
        chain.append((type(exc).__name__, str(exc).split("\n")[0]))
        exc = exc.__cause__ or exc.__context__
    return chain


def bad_broadcast(rank: int, world: int) -> dict[str, Any]:
    """PyTorch's test_exception_logger: broadcast from a root outside a 2-rank group."""
    seen = {}
    for mode in ("off", "on", "recording"):
        if mode != "off":
            autoannot.enable()
        try:
            if mode == "recording":
                with autoannot.record():
                    dist.broadcast(torch.ones(2), src=3)
            else:
                dist.broadcast(torch.ones(2), src=3)
        except Exception as exc:
            frames = []
            tb = exc.__traceback__
            while tb is not None:
                code = tb.tb_frame.f_code
                if "autoannot" in code.co_filename and "__tracebackhide__" not in (
                        tb.tb_frame.f_locals):
                    frames.append(code.co_name)
                tb = tb.tb_next
            seen[mode] = {"chain": _chain(exc), "cause": repr(exc.__cause__),
                          "context": repr(exc.__context__), "agent frames shown": frames}
        autoannot.disable()
    return seen


def test_a_failing_collective_raises_what_it_raises_with_the_agent_off() -> None:
    seen = run_ranks(bad_broadcast, 2, "gloo")
    for rank_seen in seen:
        assert rank_seen["on"] == rank_seen["off"]
        assert rank_seen["recording"] == rank_seen["off"]


def test_torch_tests_are_call_sites_and_the_standard_library_is_not(fake_world, agent) -> None:
    """PyTorch's own distributed tests live in torch/testing: their lines are the call sites.
    A collective called straight from threading's or multiprocessing's code has none."""
    path = os.path.join(os.path.dirname(torch.__file__), "testing", "_internal", "a_test.py")
    code = compile("def test():\n    dist.all_reduce(torch.ones(2))\n", path, "exec")
    namespace = {"dist": dist, "torch": torch}
    exec(code, namespace)
    with autoannot.record() as records:
        namespace["test"]()
        thread = threading.Thread(target=dist.barrier)
        thread.start()
        thread.join()
    assert [r.call_site for r in records] == [f"{path}:2", "<no user frame>"]


def test_a_call_site_is_found_by_its_code_object_not_by_an_id_it_once_had(fake_world,
                                                                           agent) -> None:
    """Call sites are kept by code object identity (a code object hashes its contents at every
    lookup): an entry under the same id for another code object (a freed one's address, taken
    again) is not this code's; the launch's own line is recorded."""
    from autoannot.describe import sites

    def launch() -> None:
        dist.all_reduce(torch.ones(2))

    other = compile("pass", "elsewhere.py", "exec")
    sites.SITES[id(launch.__code__)] = (other, {0: "elsewhere.py:1"})
    with autoannot.record() as records:
        launch()
    line = launch.__code__.co_firstlineno + 1
    assert [r.call_site for r in records] == [f"{__file__}:{line}"]
    assert sites.SITES[id(launch.__code__)][0] is launch.__code__


# --- fork ------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_every_lock_is_renewed_in_a_forked_child(agent) -> None:
    """A thread holds each of the agent's locks while the process forks: the child can still
    take every one of them (enable, disable, record and capture in the child do)."""
    from autoannot.base import importhook, locks
    from autoannot.describe import groups
    from autoannot.keep import capture_identity, ledgers

    def agent_locks() -> list[Any]:
        return [hooks.AGENT._lock, importhook._lock, ledgers._LOCK.lock,
                capture_identity._LOCK.lock, groups._lock, hooks.AGENT.state._lock]

    held = agent_locks()
    layer = hooks.AGENT.layer
    if layer is not None:
        held.append(layer._lock)
    assert locks.count() >= len(held)
    ready, release = threading.Event(), threading.Event()

    def hold() -> None:
        for lock in held:
            lock.acquire()
        ready.set()
        release.wait()
        for lock in reversed(held):
            lock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    ready.wait()
    pid = os.fork()
    if pid == 0:  # the child: every lock free, or exit 3
        status = 0
        try:
            fresh = agent_locks()
            if layer is not None:
                fresh.append(layer._lock)
            for lock in fresh:
                if not lock.acquire(timeout=2):
                    status = 3
                    break
                lock.release()
        finally:
            os._exit(status)
    release.set()
    holder.join()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the child hung")
    assert os.waitstatus_to_exitcode(status) == 0


# --- a long replay -----------------------------------------------------------------------------


def test_a_replay_of_5000_collectives_annotates(tmp_path) -> None:
    """One replay of a graph with 5,000 all-reduces on two groups, where the capture-order
    walk takes a wrong turn at the next-to-last kernel (only the last one shows it): the
    search goes back one step, with no recursion."""
    import json

    from autoannot.traces.files import Trace
    from autoannot.traces.read import annotate

    n = 5000
    kernel = "ncclDevKernel_{}_Sum_f32_RING_LL"
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": "autoannot.replay:autoannot.graph.0",
         "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1,
         "ts": 1, "dur": 5, "args": {"correlation": 7}}]
    for k in range(n):  # back to back; the last overlaps the one before (another group)
        family = "AllGather" if k == n - 1 else "AllReduce"
        start = 100 + 10 * k - (8 if k == n - 1 else 0)
        events.append({"ph": "X", "cat": "kernel", "name": kernel.format(family), "pid": 0,
                       "tid": 7, "ts": start, "dur": 5, "args": {"correlation": 7}})
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))

    def entry(group: str, kinds: list[str], position: int) -> dict[str, Any]:
        return {"api": "all_reduce", "kernels": kinds,
                "annotation": {"Collective name": "allreduce", "Process Group Name": group,
                               "stream": int(group), "Seq": position}}

    # Group 0 captured n - 1 collectives that run as AllReduce or AllGather kernels, group 1
    # one AllReduce, captured last: the walk gives kernel n-2 to group 0 (captured first);
    # then kernel n-1, an AllGather, fits no group.
    entries = [entry("0", ["AllReduce", "AllGather"], k) for k in range(n - 1)]
    entries.append(entry("1", ["AllReduce"], n - 1))
    report, patches = annotate.annotate(Trace(path), {"graphs": {"autoannot.graph.0": entries}})
    assert report.mismatches == []
    assert report.kernels_annotated == n
    by_kernel = {i: patch[0] for i, patch in patches.kernels.items()}
    groups = [by_kernel[i]["Process Group Name"] for i in sorted(by_kernel)]
    assert groups == ["0"] * (n - 2) + ["1", "0"]

"""The agent beside other users of torch's dispatcher: another library's fallback on the key
the Python layer borrows, dispatch modes and functorch transforms around collectives. Each
runs on both ways the agent sees launches below the Python API: the Python layer (no
compiler) and the native observer (torch's RecordFunction callbacks).

Real gloo groups, real tensors; a capture is the agent's CUDAGraph wrappers around a stand-in
graph (no CUDA here).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import agent_hooks as hooks
import pytest
import torch
import torch.distributed as dist
from harness import run_ranks

import autoannot
from autoannot import testing
from autoannot.describe import vocabulary as V
from autoannot.observe import group_hooks

LAYERS = ["python layer", "native observer"]


def _see_below_the_api(way: str, request, monkeypatch) -> str:
    """Rank processes started now see launches below the Python API ``way``."""
    if way == "group hooks":
        if not group_hooks.available():
            pytest.skip("this torch's process groups take no collective hooks (torch < 2.14)")
        monkeypatch.setenv("AUTOANNOT_GROUP_HOOKS", "1")
        return way
    monkeypatch.setenv("AUTOANNOT_GROUP_HOOKS", "0")  # (where torch's groups take hooks)
    if way == "native observer":
        build = request.getfixturevalue("native_build")
        monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(build.parent.parent))
        monkeypatch.setenv("AUTOANNOT_NATIVE", "1")
    else:
        monkeypatch.setenv("AUTOANNOT_NATIVE", "0")
    return way


@pytest.fixture(params=LAYERS)
def layer(request, monkeypatch) -> str:
    """The rank processes see launches below the Python API this way (on a torch whose
    process groups take hooks, with them turned off: ``AUTOANNOT_GROUP_HOOKS=0``)."""
    return _see_below_the_api(request.param, request, monkeypatch)


@pytest.fixture(params=[*LAYERS, "group hooks"])
def observer(request, monkeypatch) -> str:
    """Each way rank processes can see launches below the Python API, torch's process-group
    hooks included (torch >= 2.14: the way, where it has them)."""
    return _see_below_the_api(request.param, request, monkeypatch)


def _which() -> str:
    if hooks.AGENT.hooks is not None:
        return "group hooks"
    return "native observer" if hooks.AGENT.observer is not None else "python layer"


# --- another library owns the DeferredInit key ----------------------------------------------

class ForeignFallback:
    """What torchdistx does when it loads: a real fallback for every op on ``DeferredInit``
    (here: it counts its calls and passes them on)."""

    def __init__(self) -> None:
        self.calls = 0
        self.library = torch.library.Library("_", "IMPL")
        below = torch._C._dispatch_keyset_full_after(torch._C._dispatch_key_parse("DeferredInit"))

        def fallback(keyset: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return op.redispatch(keyset & below, *args, **kwargs)

        self.library.fallback(fallback, "DeferredInit", with_keyset=True)

    def works(self) -> bool:
        """An op called with the key included reaches it."""
        key = torch._C._dispatch_key_parse("DeferredInit")
        before = self.calls
        a, b = torch.ones(3), torch.full((3,), 2.0)
        torch._C._dispatch_tls_set_dispatch_key_included(key, True)
        try:
            result = a.add(b).tolist()
        finally:
            torch._C._dispatch_tls_set_dispatch_key_included(key, False)
        return result == [3.0, 3.0, 3.0] and self.calls > before


def _ddp_step_recorded() -> tuple[int, int, list[str]]:
    """A DDP step in a plain record(): the bucket all-reduces' elements, the parameters', and
    the Python-API launches recorded."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
    for _ in range(2):
        ddp(torch.randn(4, 32)).sum().backward()
    with autoannot.record() as records:
        ddp(torch.randn(4, 32)).sum().backward()
        dist.all_reduce(torch.ones(3))
    buckets = sum(r.annotation[V.IN_NELEMS] for r in records if r.api == "c10d.allreduce_")
    return (buckets, sum(p.numel() for p in model.parameters()),
            [r.api for r in records if not r.api.startswith("c10d.")])


def _key_given_back(timeout_s: float = 30) -> None:
    """Wait until the Python layer (if any) has given the key back: ``GRACE_S`` after its
    last hold."""
    import time

    deadline = time.monotonic() + timeout_s
    layer = hooks.AGENT.layer
    while layer is not None and layer.fallthrough_registered and time.monotonic() < deadline:
        time.sleep(0.05)
    assert layer is None or not layer.fallthrough_registered


def foreign_fallback(rank: int, world: int, when: str) -> dict[str, Any]:
    """``when``: the foreign library registers its fallback before ``enable()``, or after it
    (and after a recorder and a capture came and went)."""
    import warnings

    seen: dict[str, Any] = {}
    foreign = None
    if when == "before":
        foreign = ForeignFallback()
    hooks.AGENT.captures.by_thread()
    autoannot.enable()
    if when == "after":
        with autoannot.record():
            dist.all_reduce(torch.ones(2))
        with testing.stand_in(0):
            dist.all_reduce(torch.ones(2))
        _key_given_back()
        foreign = ForeignFallback()  # registers: nothing of the agent's is on the key now
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        buckets, parameters, python_api = _ddp_step_recorded()
        with testing.stand_in(0) as graph:
            dist.all_reduce(torch.ones(5))
    seen["records"] = python_api
    seen["ledger"] = [e["api"] for e in hooks.ledger(graph).entries]
    seen["buckets, parameters"] = (buckets, parameters)
    seen["foreign works"] = foreign.works()
    seen["said"] = [str(w.message) for w in caught if "another owner" in str(w.message)]
    seen["which"] = _which()
    return seen


@pytest.mark.parametrize("when", ["before", "after"])
def test_another_librarys_fallback_on_the_key_registers_and_works(layer: str, when: str) -> None:
    if not hasattr(torch.library.Library, "fallback"):
        pytest.skip("this torch's Library has no fallback()")
    for result in run_ranks(foreign_fallback, 2, args=(when,)):
        assert result["which"] == layer
        assert result["foreign works"]
        assert result["records"] == ["all_reduce"] and result["ledger"] == ["all_reduce"]
        buckets, parameters = result["buckets, parameters"]
        if layer == "native observer":  # no key needed
            assert buckets == parameters and result["said"] == []
        else:  # the key has another owner: the layer steps aside, and says so once
            assert len(result["said"]) == 1 and "DeferredInit" in result["said"][0]
            # none of DDP's buckets (where torch's groups take hooks, they see every one:
            # test_group_hooks.py)
            assert buckets == 0


FOREIGN_UNDER_AUTOANNOT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from test_observation import ForeignFallback
    import autoannot
    assert autoannot.is_enabled()
    foreign = ForeignFallback()  # the agent registered nothing on the key at start-up
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT={port!r})
    dist.init_process_group("gloo", rank=0, world_size=1)
    with autoannot.record() as records:
        dist.all_reduce(torch.ones(3))
        dist.group.WORLD.allreduce([torch.ones(4)]).wait()
    print(foreign.works(), [r.api for r in records])
    dist.destroy_process_group()
""")


def test_another_librarys_fallback_under_autoannot_1(layer: str) -> None:
    if not hasattr(torch.library.Library, "fallback"):
        pytest.skip("this torch's Library has no fallback()")
    from harness import free_port

    from autoannot.cli import HOOK_DIR

    tests = os.path.dirname(os.path.abspath(__file__))
    code = FOREIGN_UNDER_AUTOANNOT.format(tests=tests, port=str(free_port()))
    env = {**os.environ, "AUTOANNOT": "1",
           "PYTHONPATH": os.pathsep.join([str(HOOK_DIR), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    works, apis = done.stdout.strip().splitlines()[-1].split(" ", 1)
    assert works == "True"
    # the Python API's launch; the ProcessGroup's own where the native observer sees it, or
    # where the Python layer could take the key (it could not: stepped aside)
    both = layer == "native observer"
    assert apis == ("['all_reduce', 'c10d.allreduce_']" if both else "['all_reduce']")


def layer_lifecycle(rank: int, world: int) -> dict[str, Any]:
    import time

    key = torch._C._dispatch_key_parse("DeferredInit")

    def state() -> list[bool]:  # a fallback on the key, and the key included on this thread
        return [torch._C._dispatch_has_backend_fallback(key),
                torch._C._dispatch_tls_is_dispatch_key_included(key)]

    seen: dict[str, Any] = {"imported": state()}
    autoannot.enable()
    seen["enabled"] = state()
    layer = hooks.AGENT.python_layer()
    layer.grace_s = 0.3
    with autoannot.record() as records:
        seen["recording"] = state()
        dist.group.WORLD.allreduce([torch.ones(2)]).wait()
    seen["just after"] = state()
    with autoannot.record():  # within the grace: the key is still ours, taken again
        seen["again"] = state()
    start = time.monotonic()
    _key_given_back()
    seen["given back after (s)"] = round(time.monotonic() - start, 1)
    seen["after the grace"] = state()
    with autoannot.record():
        seen["a third time"] = state()
    autoannot.disable()  # gives it back at once
    seen["disabled"] = state()
    seen["records"] = [r.api for r in records]
    seen["registrations"] = layer.registrations
    return seen


def test_the_layer_registers_nothing_until_asked_and_gives_the_key_back(monkeypatch) -> None:
    """The Python layer: enable() puts nothing on the dispatcher; a record() borrows the key
    (a fall-through for every op, the key included on its thread) and gives it back once no
    record or capture held it for its grace period (at once on disable())."""
    monkeypatch.setenv("AUTOANNOT_NATIVE", "0")
    monkeypatch.setenv("AUTOANNOT_GROUP_HOOKS", "0")  # (where torch's groups take hooks)
    (seen,) = run_ranks(layer_lifecycle, 2, "fake", ranks=(0,))
    assert seen["imported"] == seen["enabled"] == [False, False]
    assert seen["recording"] == seen["again"] == seen["a third time"] == [True, True]
    assert seen["just after"] == [True, False]  # kept for the grace, not included
    assert seen["after the grace"] == seen["disabled"] == [False, False]
    assert seen["given back after (s)"] < 5
    assert seen["records"] == ["c10d.allreduce_"] and seen["registrations"] == 1


def new_threads_held(rank: int, world: int) -> dict[str, Any]:
    import threading

    key = torch._C._dispatch_key_parse("DeferredInit")
    profiled: list[str] = []

    def users_profile(frame: Any, event: str, arg: Any) -> None:  # (a profiler's, as yappi's)
        if event == "call":
            profiled.append(frame.f_code.co_name)

    def in_a_thread() -> bool:
        seen: list[bool] = []

        def body() -> None:
            seen.append(torch._C._dispatch_tls_is_dispatch_key_included(key))

        thread = threading.Thread(target=body)
        thread.start()
        thread.join()
        return seen[0]

    threading.setprofile(users_profile)
    autoannot.enable()
    layer = hooks.AGENT.python_layer()
    layer.hold()  # (as a journal open from the start holds the thread importing torch)
    layer.hold_new_threads()
    seen: dict[str, Any] = {"held in a new thread": in_a_thread(),
                            "profile chained": "body" in profiled}
    autoannot.disable()
    seen["after disable"] = in_a_thread()
    seen["profile function restored"] = threading.getprofile() is users_profile
    threading.setprofile(None)
    return seen


def test_new_threads_hold_the_layer_and_the_users_profile_function_is_kept(
        monkeypatch) -> None:
    """With a journal from the start, every thread started after holds the layer (the key
    included there); the profile function the user set before runs in those threads too, and
    is threading's again, by identity, after ``disable()`` (new threads then hold nothing)."""
    monkeypatch.setenv("AUTOANNOT_NATIVE", "0")
    monkeypatch.setenv("AUTOANNOT_GROUP_HOOKS", "0")
    (seen,) = run_ranks(new_threads_held, 2, "fake", ranks=(0,))
    assert seen == {"held in a new thread": True, "profile chained": True,
                    "after disable": False, "profile function restored": True}


def start_up_hold_let_go(rank: int, world: int, folder: str) -> dict[str, Any]:
    import threading

    from autoannot.keep.ring import Ring

    key = torch._C._dispatch_key_parse("DeferredInit")
    pg = dist.group.WORLD
    autoannot.disable()
    ring = Ring(os.path.join(folder, f"run{rank}"), 64)  # (as AUTOANNOT_RING opens it: first)
    hooks.AGENT.state.open_journal(ring)
    autoannot.enable()
    layer = hooks.AGENT.python_layer()
    sums: list[float] = []

    def launches() -> None:
        tensor = torch.ones(3) * (rank + 1)
        pg.allreduce([tensor]).wait()
        sums.append(tensor.sum().item())

    for _ in range(2):  # (a thread started after: held for its life, which ends here)
        thread = threading.Thread(target=launches)
        thread.start()
        thread.join()
    launches()
    seen: dict[str, Any] = {"held while on": (layer.holders, layer.registered,
                                              torch._C._dispatch_tls_is_dispatch_key_included(
                                                  key))}
    hooks.AGENT.state.close_journal(ring)
    ring.close()
    autoannot.disable()
    launches()  # (the agent off: torch's kernel alone, the same sum)
    seen["after disable"] = (layer.holders, layer.registered,
                             torch._C._dispatch_tls_is_dispatch_key_included(key),
                             torch._C._dispatch_has_kernel_for_dispatch_key("c10d::allreduce_",
                                                                             key))
    seen["sums"] = sums
    return seen


def test_disable_lets_go_of_the_start_up_hold_and_of_threads_that_ended(monkeypatch,
                                                                         tmp_path) -> None:
    """A journal open from the start holds the layer on the thread that enables the agent and
    on each thread started after, for its life. Once those threads have ended and
    ``disable()`` is called, the key is off the thread and the kernels off torch's ops: a
    collective costs what it does without the agent (before: the layer stayed held, every
    ``c10d::`` op went through Python, ~6 us a launch more, for the rest of the process)."""
    monkeypatch.setenv("AUTOANNOT_NATIVE", "0")
    monkeypatch.setenv("AUTOANNOT_GROUP_HOOKS", "0")
    for seen in run_ranks(start_up_hold_let_go, 2, "gloo", args=(str(tmp_path),)):
        assert seen["held while on"] == [1, True, True]  # (the ended threads' holds let go)
        assert seen["after disable"] == [0, False, False, False]
        assert seen["sums"] == [9.0] * 4  # (ranks 1 + 2, three elements)


# --- dispatch modes and functorch around collectives ------------------------------------------

def _modes() -> dict[str, Any]:
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return {"pass-through TorchDispatchMode": PassThrough, "CommDebugMode": CommDebugMode}


def _collectives(rank: int) -> list[Any]:
    """Python-API, ProcessGroup and funcol launches; their results."""
    import torch.distributed._functional_collectives as funcol

    pg = dist.group.WORLD
    x = torch.arange(4.0) + rank
    y = torch.arange(6.0) * (rank + 1)
    dist.all_reduce(x)
    pg.allreduce([y]).wait()
    z = funcol.wait_tensor(funcol.all_reduce(torch.arange(5.0) + rank, "sum", pg))
    return [x.tolist(), y.tolist(), z.tolist()]


def under_modes(rank: int, world: int) -> dict[str, Any]:
    autoannot.disable()
    expected = _collectives(rank)
    hooks.AGENT.captures.by_thread()
    autoannot.enable()
    observer = hooks.AGENT.observer
    if observer is not None:  # gloo makes no record of its launches: ask for the operators
        observer.module.set_capture_inputs(True)
    found: dict[str, Any] = {"which": _which(), "expected": expected}
    for name, mode in _modes().items():
        with mode(), testing.stand_in(11) as graph:
            got = _collectives(rank)
        with mode(), autoannot.record() as records:
            _collectives(rank)
        found[name] = {"results": got, "ledger": [(e["api"], e["annotation"][V.IN_NELEMS])
                                                  for e in hooks.ledger(graph).entries],
                       "records": [(r.api, r.annotation[V.IN_NELEMS]) for r in records]}
    return found


def test_captures_and_recorders_under_dispatch_modes(observer: str) -> None:
    """A pass-through TorchDispatchMode and CommDebugMode around a capture and a recorder:
    results as with the agent off, every launch annotated once."""
    for result in run_ranks(under_modes, 2):
        assert result["which"] == observer
        for name in _modes():
            seen = result[name]
            assert seen["results"] == result["expected"], name
            assert [tuple(e) for e in seen["ledger"]] == [
                ("all_reduce", 4), ("c10d.allreduce_", 6), ("funcol.all_reduce", 5)], name
            assert seen["records"] == seen["ledger"], name


def under_functorch(rank: int, world: int) -> dict[str, Any]:
    """``torch.func.grad`` around ``dist.all_reduce`` and funcol. (``torch.vmap`` over funcol
    reads its results before they are waited for here, agent off too: its values vary.)"""
    import torch.distributed._functional_collectives as funcol

    pg = dist.group.WORLD

    def with_dist(x: torch.Tensor) -> torch.Tensor:
        y = x.detach().clone()
        dist.all_reduce(y)
        return (x * y).sum()

    def with_funcol(x: torch.Tensor) -> torch.Tensor:
        return (x * funcol.all_reduce(x.detach(), "sum", pg)).sum()

    x = torch.arange(3.0) + rank

    def run() -> list[Any]:
        return [torch.func.grad(with_dist)(x).tolist(), torch.func.grad(with_funcol)(x).tolist()]

    autoannot.disable()
    expected = run()
    hooks.AGENT.captures.by_thread()
    autoannot.enable()
    with autoannot.record() as records:
        got = run()
    with testing.stand_in(0) as graph:
        captured = run()
    return {"which": _which(), "expected": expected, "got": got, "captured": captured,
            "records": [r.api for r in records],
            "ledger": [e["api"] for e in hooks.ledger(graph).entries]}


def test_functorch_transforms_around_collectives(observer: str) -> None:
    for result in run_ranks(under_functorch, 2):
        assert result["which"] == observer
        assert result["got"] == result["expected"] == result["captured"]
        python_api = [a for a in result["records"] if not a.startswith(("c10d.", "_c10d"))]
        assert python_api[:2] == ["all_reduce", "funcol.all_reduce"]
        assert result["ledger"][:2] == ["all_reduce", "funcol.all_reduce"]


def two_recorders(rank: int, world: int) -> dict[str, Any]:
    """``record()`` and ``record(python_api_only=True)`` open together."""
    autoannot.enable()
    pg = dist.group.WORLD
    with autoannot.record() as everything, autoannot.record(python_api_only=True) as api_only:
        pg.allreduce([torch.ones(4)]).wait()  # below the Python API
        dist.all_reduce(torch.ones(3))
    return {"which": _which(), "everything": everything.apis(), "api_only": api_only.apis()}


def test_a_python_api_only_recorder_beside_a_full_one_gets_the_python_api_only(
        observer: str) -> None:
    """Before, the launch below the Python API went into both (every observer: the sink gave
    each launch to every open recorder)."""
    for result in run_ranks(two_recorders, 2):
        assert result["which"] == observer
        assert result["everything"] == ["c10d.allreduce_", "all_reduce"]
        assert result["api_only"] == ["all_reduce"]


# --- what tests/gpu/observer_checks.py found on one H200 (committed) ---------------------------

GPU_CHECKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gpu", "observer")


@pytest.mark.parametrize("which", ["native", "python"])
def test_one_gpu_ledgers_equal_torchs_records_field_for_field(which: str) -> None:
    """On one H200 (a 1-rank NCCL group: torch records each launch on the CPU though NCCL
    launches no kernel for most): ten different collectives on the default group and on a
    subgroup, captured; the graph's ledger and a recorder's records against torch's own
    ``record_param_comms`` of the same calls. Re-checked here from the committed run."""
    import json

    with open(os.path.join(GPU_CHECKS, f"checks_{which}.json")) as f:
        run = json.load(f)
    assert run["native"] == (which == "native") and run["verified"]
    torch_records, ledger, records = run["torch_records"], run["ledger"], run["records"]
    assert len(torch_records) == len(ledger) == len(records) == 20
    for entry, record, expected in zip(ledger, records, torch_records, strict=True):
        kernel = {k: v for k, v in expected.items() if k in V.KERNEL_KEYS}
        got = {k: v for k, v in entry["annotation"].items() if k in V.KERNEL_KEYS}
        assert got == kernel
        assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in kernel.items()}
        assert record["param_comms"] == expected
    subgroup = [e for e in torch_records if e[V.PG_NAME] != "0"]
    assert len(subgroup) == 10 and {e[V.PG_RANKS] for e in subgroup} == {"[]"}
    assert [e["api"] for e in ledger].count("c10d.allreduce_") == 2  # the ProcessGroup's own
    for mode in ("pass-through TorchDispatchMode", "CommDebugMode"):
        assert run[mode]["results equal agent-off"] and run[mode]["ledger right"], mode
    ddp = run["ddp"]
    assert ddp["recorded buckets"] == ddp["captured buckets"] > 1
    assert ddp["recorded elements"] == ddp["captured elements"] == ddp["parameters"]

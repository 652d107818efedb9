"""The native observer (autoannot/native/observer.cpp): launches below the Python API seen
through torch's RecordFunction callbacks — no dispatch key — noted in C++ in a capture, told
to Python at once while a recorder is open.

Real gloo groups (2 and 4 ranks), the observer compiled against this torch for the session
(``native_build``, conftest.py). What a capture notes is checked against torch's own record of
the launch (the profiler's ``record_param_comms``: ``test_noted_launches_read_as_torch_records
_them``) and against the golden eager records (``test_golden.py``, through the observer).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import native_cases
import pytest
from harness import run_ranks

from autoannot import native
from autoannot.describe import sites
from autoannot.describe import vocabulary as V


@pytest.fixture(scope="module", autouse=True)
def built(native_build: Any, monkeypatch_module: Any) -> Any:
    """The observer built for this torch (the rank processes inherit the folder)."""
    monkeypatch_module.setenv("AUTOANNOT_NATIVE_DIR", str(native_build.parent.parent))
    monkeypatch_module.delenv("AUTOANNOT_NATIVE", raising=False)
    return native_build


def _without_sites(entries: list[dict[str, Any]]) -> list[tuple]:
    return [(e["api"], e["annotation"]) for e in entries]


@pytest.mark.parametrize("world", [2, 4])
def test_captured_launches_read_as_recorded(world: int) -> None:
    for rank, result in enumerate(run_ranks(native_cases.mixed_launches, world)):
        noted, recorded = result["noted"], result["recorded"]
        cpp_origin = [e for e in noted if e["api"].startswith("c10d.")]
        assert len(cpp_origin) >= 10 and len(noted) > len(cpp_origin), rank
        # every launch noted in C++: the C++-origin ones, and the Python API's their proxies
        # handed to the observer
        assert result["noted_count"] == len(noted)
        # the same launches, annotation for annotation, in the same order, as a recorder gets
        # them (the C++-origin ones told to Python as they return)
        assert _without_sites(noted) == _without_sites(recorded), rank
        # captured again: no new kind of launch, the same entries (derived once, kept)
        assert result["kinds_after_again"] == result["kinds"] > 0
        assert _without_sites(result["again"]) == _without_sites(noted)
        for entry, record in zip(noted, recorded, strict=True):
            if entry["api"].startswith("c10d."):
                assert entry["call_site"] == sites.NATIVE_CALLER
                assert record["call_site"].rsplit(":", 1)[0].endswith("native_cases.py")
            else:  # the proxies' launches keep the user's line
                assert entry["call_site"] == record["call_site"]
        # registered only while something asked: idle no, recording yes, after no
        assert result["registered"] == [False, True, False]


def test_python_api_launches_handed_off_read_as_the_proxies_annotate_them() -> None:
    for rank, result in enumerate(run_ranks(native_cases.python_api_handoff, 2)):
        noted, recorded = result["noted"], result["recorded"]
        assert all(e["call_site"] != result["raising_line"] for e in noted)  # launched nothing
        assert _without_sites(noted) == _without_sites(recorded), rank
        python_api = [i for i, e in enumerate(noted) if not e["api"].startswith("c10d.")]
        assert [noted[i]["call_site"] for i in python_api] == [
            recorded[i]["call_site"] for i in python_api]  # the user's lines, kept
        apis = [e["api"] for e in noted]
        assert apis[:3] == ["all_gather_into_tensor", "reduce_scatter_tensor",
                            "all_to_all_single"], apis
        assert apis.count("c10d.allreduce_") == 2  # not labelled by the call that raised
        assert apis[-1] == "all_reduce"
        # all but the block's launch (its proxies annotate it) were noted in C++
        assert result["noted_count"] == len(noted) - 1
        assert result["recorded_apis"] == ["all_reduce"]
        assert [e["api"] for e in result["with_recorder"]] == ["all_reduce"]
        assert not result["handoff_after"]


def test_a_capture_asks_for_no_operator_and_gloo_records_nothing() -> None:
    for result in run_ranks(native_cases.work_ranges_only, 2):
        # the Python API's launches, keyed and noted by their proxies' C wrappers; the
        # C++-origin one goes unnoted (gloo makes no record of it: see the README's limits)
        assert [e["api"] for e in result["entries"]] == ["all_reduce", "broadcast"]
        assert result["noted"] == 2
        (capturing, recording, journaling), registered = result["demand_in_capture"]
        assert capturing and not recording and not journaling and registered


def test_python_api_launches_keyed_in_c_get_what_the_table_derives_for_the_call() -> None:
    for result in run_ranks(native_cases.keyed_by_proxies, 2):
        assert result["first"] == result["expected"]  # the call that raised: not noted
        assert result["again"] == result["expected"]  # (from what the wrappers kept)
        assert result["noted"] == 2 * len(result["expected"])
        assert result["sites"] == [result["call_line"]]  # the user's line
        assert result["kept"] == len(result["expected"]) - 1  # (MAX and SUM on sub: one key)
        assert result["kept_after_group_gone"] == 0


def test_noted_launches_read_as_torch_records_them() -> None:
    """torch's own record of a launch (ParamCommsDebugInfo, as ProcessGroupNCCL makes it) is
    what a capture notes and a recorder gets: field for field what torch's profiler writes
    for it — one-rank and unstrided groups (no ranks listed), a send's peer, splits, 40
    ranks (truncated)."""
    (result,) = run_ranks(native_cases.as_nccl, 1, "fake")
    expected = result["torch"]
    assert len(expected) == len(result["noted"]) == 6
    for entry, record, torch_record in zip(result["noted"], result["recorded"], expected,
                                           strict=True):
        kernel = {k: v for k, v in torch_record.items() if k not in V.CPU_ONLY_KEYS}
        got = {k: v for k, v in entry["annotation"].items() if k in V.KERNEL_KEYS}
        assert got == kernel, entry["api"]
        assert list(got) == [k for k in V.KERNEL_KEYS if k in kernel]  # the profiler's order
        assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in kernel.items()}
        assert record["param_comms"] == torch_record
        assert record["annotation"] == entry["annotation"]
        assert entry["call_site"] == sites.NATIVE_CALLER
    # AUTOANNOT_RECORD's file: each launch as it is entered, the Work ranges alone asked for
    assert result["journal_registered"] == [[False, False, True], True]
    assert [line["param_comms"] for line in result["journal"]] == expected
    assert [line["api"] for line in result["journal"]] == [e["api"] for e in result["noted"]]
    ranks = [e[V.PG_RANKS] for e in expected]
    assert ranks[:3] == ["[2, 4, 6, 8]", "[]", "[]"]  # rebuilt from start and stride
    assert ranks[5].endswith(", ..., 39]")
    assert expected[3][V.DST_RANK] == 1


def test_ddp_buckets_are_recorded_and_captured() -> None:
    for result in run_ranks(native_cases.ddp_steps, 2):
        buckets = [r for r in result["recorded"] if r["api"] == "c10d.allreduce_"]
        assert len(buckets) >= 3
        assert sum(r["annotation"][V.IN_NELEMS] for r in buckets) == result["parameters"]
        assert result["python_only"] == 0  # python_api_only: DDP's launches left out
        noted = [e for e in result["noted"] if e["api"] == "c10d.allreduce_"]
        assert result["noted_count"] == len(noted) == len(buckets)
        assert _without_sites(noted) == _without_sites(buckets)
        # the ring keeps every bucket's launch, where a record file would ask for none
        assert result["ringed"].count("c10d.allreduce_") == len(buckets), result["ringed"]


def test_a_launch_from_a_thread_with_no_python_frame_is_recorded() -> None:
    """What autograd's device threads do on a GPU (DDP's reducer): found on the GPU machine,
    where a plain record() got none of DDP's buckets (the listener looked for a caller frame
    that such a thread does not have)."""
    for result in run_ranks(native_cases.no_python_caller, 2):
        (from_cpp, from_python) = (tuple(r) for r in result["records"])
        assert from_cpp == ("c10d.allreduce_", 3, sites.NO_PYTHON_CALLER)
        assert from_python[:2] == ("c10d.allreduce_", 4)
        assert from_python[2].rsplit(":", 1)[0].endswith("native_cases.py")


def test_a_destroyed_group_whose_launches_were_noted_is_freed() -> None:
    for result in run_ranks(native_cases.group_lifetime, 2):
        assert result["entries"] == ["c10d.allreduce_"] and result["kinds"] >= 1
        assert result["with_group"] > result["base"]  # gloo's threads for the new group
        assert result["after"] == result["base"]  # gone with it: nothing of ours held it
        assert result["kinds_after"] == 0
        assert result["holding_after_record"] == 0  # (it held the group: a hang at its death)
        world = result["world_name"]
        assert [tuple(e) for e in result["across"]] == [("c10d.allreduce_", world, 3)] * 2


def test_registered_only_while_asked_and_no_dispatch_key_touched() -> None:
    for result in run_ranks(native_cases.observer_state, 2):
        seen = result["seen"]
        assert seen["idle"] == [False, [False, False, False]]
        assert seen["record(python_api_only=True)"] == [False, [False, False, False]]
        assert seen["record()"] == [True, [False, True, False]]
        assert seen["capture"] == [[True, False, False], True]
        assert seen["after"] == [False, [False, False, False]]
        assert seen["record() with the agent off"] == [False, [False, False, False]]
        assert [e["api"] for e in result["first"]] == ["c10d.allreduce_"]
        assert _without_sites(result["again"]) == _without_sites(result["first"])
        assert result["orphaned"] == [] and seen["pending after"] == 0
        assert seen["DeferredInit: a fallback, included"] == [False, False]
        assert not seen["layer made"]


def test_call_claimed_returns_raises_and_claims_only_during_the_call(built: Any) -> None:
    module = native.load()
    assert module is not None

    def seen(*args: Any, **kwargs: Any) -> Any:
        return args, kwargs, module.claimed()

    sentinel = object()
    assert module.call_claimed(seen, (1, sentinel), {"k": 2}) == ((1, sentinel), {"k": 2},
                                                                  True)
    assert module.call_claimed(seen, (), None) == ((), {}, True)
    assert not module.claimed()

    class Failure(Exception):
        pass

    def fails() -> None:
        raise Failure("the collective's own error")

    with pytest.raises(Failure, match="own error"):
        module.call_claimed(fails, (), None)
    assert not module.claimed()
    with pytest.raises(TypeError, match="call_claimed"):
        module.call_claimed(seen, [1], None)


def test_not_loaded_when_turned_off_or_not_built(tmp_path, monkeypatch) -> None:
    from autoannot.base import config

    assert native.built_path() is not None
    assert not config.from_environment({"AUTOANNOT_NATIVE": "0"}).native
    monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(tmp_path))
    assert native.built_path() is None  # another folder: nothing built there
    assert native.load() is None


def test_stand_ins_read_as_tensors() -> None:
    import torch

    from autoannot.describe import collectives, metadata

    row = next(r for r in collectives.COLLECTIVES if r.api == "allgather_"
               and r.module == collectives.PG_OPS)
    plan = metadata.Plan(row, torch.ops.c10d.allgather_.default)
    tensors = [[torch.zeros(3, 2, dtype=torch.complex64)] * 2], [torch.ones(3, 2,
                                                                             dtype=torch.complex64)]
    noted = [[[("tensor", torch.complex64, (3, 2))] * 2], [("tensor", torch.complex64, (3, 2))]]
    stand_ins = [native.stand_in(value) for value in noted]
    assert repr(stand_ins[1][0]) == "TensorFacts(torch.complex64, (3, 2))"
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    group = dist.group.WORLD.boxed()
    assert plan.derive((*stand_ins, group), {}) == plan.derive((*tensors, group), {})


def test_build_native_cli_exit_codes_and_doctor(tmp_path, built) -> None:
    env = dict(os.environ)
    done = subprocess.run([sys.executable, "-m", "autoannot", "build-native"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == str(built)  # built: nothing to do
    doctor = subprocess.run([sys.executable, "-m", "autoannot", "doctor"], env=env,
                            capture_output=True, text=True, timeout=600)
    assert f"native observer: built ({built})" in doctor.stdout
    assert "annotated by the native observer" in doctor.stdout
    assert "C++ kernels on the c10d:: ops (torch's BackendSelect key" in doctor.stdout
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    failed = subprocess.run([sys.executable, "-m", "autoannot", "build-native"],
                            env={**env, "AUTOANNOT_NATIVE_DIR": str(blocker)},
                            capture_output=True, text=True, timeout=600)
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr.startswith("autoannot build-native:") and "failed" in failed.stderr
    off = subprocess.run([sys.executable, "-m", "autoannot", "doctor"],
                         env={**env, "AUTOANNOT_NATIVE": "0"}, capture_output=True, text=True,
                         timeout=600)
    assert "native observer: off (AUTOANNOT_NATIVE=0)" in off.stdout


FORKS_WHILE_LAUNCHING = """
import os, sys, threading, time
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
import autoannot
from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT

autoannot.enable()
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
module = AGENT.observer.module
pg = dist.group.WORLD
stop, going = threading.Event(), threading.Event()
# What the child runs, run once first: a function-local static torch initializes on first use
# (a CPU kernel's dispatch stub) is never half made at fork (a child hung there, in torch's
# own code, once in a few runs: the first fork raced the busy thread's first launch)
pg.allreduce([torch.ones(4)]).wait()
(torch.ones(2) + 1).sum()

def launching():  # the callback takes the observer's locks on this thread, without the GIL
    while not stop.is_set():
        pg.allreduce([torch.ones(4)]).wait()
        going.set()

hung = failed = 0
with autoannot.record() as records:
    busy = threading.Thread(target=launching)
    busy.start()
    going.wait()
    for _ in range(int(sys.argv[1])):
        pid = os.fork()
        if pid == 0:  # a DataLoader worker: the observer answers, and asks nothing of it
            ok = (module.kinds() >= 0 and module.demand() == (False, False, False)
                  and (torch.ones(2) + 1).sum() == 4)
            os._exit(0 if ok else 3)
        deadline = time.monotonic() + 20
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            hung += 1
        elif os.waitstatus_to_exitcode(done[1]) != 0:
            failed += 1
    stop.set()
    busy.join()
    registered = module.registered()
print(hung, failed, registered, len(records) > 0)
"""


def test_a_forked_child_neither_hangs_on_the_observer_nor_records_for_its_parent(tmp_path
                                                                               ) -> None:
    """fork() while another thread launches (the callback holding the observer's lock): the
    child — a DataLoader worker — finds the observer's locks free and its callback asking for
    nothing (its parent's recorder is not its own: before, the worker recorded every launch
    into it); the parent keeps recording."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FORKS_WHILE_LAUNCHING, "40"], cwd=tmp_path,
                          env=os.environ, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-4:] == ["0", "0", "True", "True"], done.stdout


def test_kinds_stay_bounded_when_sizes_keep_changing() -> None:
    """Before, every new size was a kind kept for good, in C++ and in Python (240 launches of
    200 sizes: 200 kinds each side); now at most twice ``CACHE_SIZE`` (32 here), the oldest
    let go a generation after the observer forgot them, and every launch recorded right."""
    for result in run_ranks(native_cases.many_kinds, 2, backend="fake"):
        assert result["recorded"] == result["sizes"]
        assert result["most_in_cpp"] <= 32 and result["most_in_python"] <= 2 * 32
        assert result["let_go"] >= 200 - 3 * 32

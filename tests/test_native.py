"""The native kernel (autoannot/native): C++-origin launches in a capture, noted in C++, give
the ledger entries the Python kernels give, in launch order among the Python-API launches.

Real gloo groups (2 and 4 ranks), the kernel compiled against this torch for the session.
"""

from __future__ import annotations

import os
from typing import Any

import native_cases
import pytest
from harness import run_ranks

from autoannot import native, recorder


@pytest.fixture(scope="module", autouse=True)
def built(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The kernel built for this torch in a folder of this run (the rank processes inherit
    the variable)."""
    previous = os.environ.get("AUTOANNOT_NATIVE_DIR")
    os.environ["AUTOANNOT_NATIVE_DIR"] = str(tmp_path_factory.mktemp("native"))
    try:
        yield native.build()
    finally:
        if previous is None:
            del os.environ["AUTOANNOT_NATIVE_DIR"]
        else:
            os.environ["AUTOANNOT_NATIVE_DIR"] = previous


def _without_sites(entries: list[dict[str, Any]]) -> list[tuple]:
    return [(e["api"], e["annotation"], e["kernels"]) for e in entries]


@pytest.mark.parametrize("world", [2, 4])
def test_noted_launches_read_as_the_python_kernels_annotate_them(world: int) -> None:
    for rank, result in enumerate(run_ranks(native_cases.mixed_launches, world)):
        assert result["loaded"], rank
        python, noted = result["python"], result["native"]
        assert result["noted_by_python_run"] == 0  # no capture the kernel knows: let through
        cpp_origin = [e for e in python if e["api"].startswith("c10d.")]
        # every launch noted: the C++-origin ones, and the Python-API ones their proxies
        # handed to the kernel
        assert len(cpp_origin) >= 10 and len(python) > len(cpp_origin)
        assert result["noted_by_native_run"] == len(python)
        # the same entries, annotation for annotation, in the same order
        assert _without_sites(noted) == _without_sites(python), rank
        # captured again: no new kind of launch, the same entries (derived once, kept)
        assert result["kinds_after_again"] == result["kinds"] > 0
        assert _without_sites(result["again"]) == _without_sites(noted)
        for entry, before in zip(noted, python, strict=True):
            if entry["api"].startswith("c10d."):
                assert entry["call_site"] == recorder.NATIVE_CALLER
            else:  # the proxies' launches keep the user's line
                assert entry["call_site"] == before["call_site"]
                assert entry["call_site"].rsplit(":", 1)[0].endswith("native_cases.py")


def test_python_api_launches_handed_off_read_as_the_proxies_annotate_them() -> None:
    for rank, result in enumerate(run_ranks(native_cases.python_api_handoff, 2)):
        python, noted = result["python"], result["native"]
        assert result["noted_by_python_run"] == 0
        assert all(e["call_site"] != result["raising_line"] for e in python)  # it launched nothing
        # the entries, label for label (the outer call's, not the nested one's), line for line
        assert _without_sites(noted) == _without_sites(python), rank
        assert [e["call_site"] for e in noted if not e["api"].startswith("c10d.")] == [
            e["call_site"] for e in python if not e["api"].startswith("c10d.")]
        apis = [e["api"] for e in noted]
        assert apis[:3] == ["all_gather_into_tensor", "reduce_scatter_tensor",
                            "all_to_all_single"], apis
        assert apis.count("c10d.allreduce_") == 2  # not taken for the call that raised
        assert apis[-1] == "all_reduce"
        assert all(e["call_site"].rsplit(":", 1)[0].endswith("native_cases.py")
                   for e in noted if not e["api"].startswith("c10d."))
        # all but the block's calls (its proxies annotate it) were noted by the kernel
        assert result["noted_by_native_run"] == len(noted) - 1
        assert result["recorded"] == ["all_reduce"] and result["noted_with_recorder"] == 0
        assert [e["api"] for e in result["recorded_entries"]] == ["all_reduce"]
        assert not result["handoff_after"] and not result["armed_after"]


def test_a_handed_off_launch_no_kernel_noted_is_noted_after_its_call() -> None:
    for result in run_ranks(native_cases.op_without_native_kernel, 2):
        assert result["noted"] == 2  # the all-reduces; the broadcast has no native kernel
        assert [e["api"] for e in result["native"]] == ["all_reduce", "broadcast", "all_reduce"]
        assert result["native"] == result["python"]  # the broadcast's line too


def test_a_destroyed_group_whose_launches_were_noted_is_freed() -> None:
    for result in run_ranks(native_cases.group_lifetime, 2):
        assert result["entries"] == ["c10d.allreduce_"] and result["kinds"] >= 1
        assert result["with_group"] > result["base"]  # gloo's threads for the new group
        assert result["after"] == result["base"]  # gone with it: nothing of ours held it
        assert result["kinds_after"] == 0
        world = result["world_name"]
        assert [tuple(e) for e in result["across"]] == [("c10d.allreduce_", world, 3)] * 2


def test_funcol_ops_recorders_and_fake_tensors_are_not_noted() -> None:
    for result in run_ranks(native_cases.funcol_and_recorder, 2):
        # compiled code's op: annotated once, by its own kernel; the c10d launch below it
        # is not noted again
        assert [e["api"] for e in result["funcol"]] == ["_c10d_functional.all_reduce_"]
        assert result["funcol_noted"] == 0
        # a recorder open: every launch goes to it (the Python kernels), none is noted
        assert result["recorder_noted"] == 0
        assert result["recorded"] == ["c10d.allreduce_"]
        assert [e["api"] for e in result["recorder_entries"]] == ["c10d.allreduce_"]
        assert result["fake_noted"] == 0 and result["fake_entries"] == []


def test_ddp_buckets_noted_as_the_python_kernels_annotate_them() -> None:
    for result in run_ranks(native_cases.ddp_steps, 2):
        python, noted = result["python"], result["native"]
        buckets = [e for e in python if e["api"] == "c10d.allreduce_"]
        assert len(buckets) >= 3 and result["noted"] == len(buckets)
        assert _without_sites(noted) == _without_sites(python)


def test_disable_takes_the_native_kernels_off_and_enable_puts_them_back() -> None:
    for result in run_ranks(native_cases.layer_state, 2):
        assert result["on"] and not result["off"]
        assert [e["api"] for e in result["first"]] == ["c10d.allreduce_"]
        assert _without_sites(result["again"]) == _without_sites(result["first"])
        assert not result["included_after"]  # the key left as the thread had it
        assert result["orphaned"] == [] and result["pending_after"] == 0
        names = result["group_names"]
        assert all(noted == real for noted, real in names) and len({n for n, _ in names}) == 3


def test_not_loaded_when_turned_off_or_not_built(tmp_path, monkeypatch) -> None:
    assert native.built_path() is not None
    monkeypatch.setenv("AUTOANNOT_NATIVE", "0")
    assert not native.enabled()
    monkeypatch.setenv("AUTOANNOT_NATIVE", "1")
    monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(tmp_path))
    assert native.built_path() is None  # another folder: nothing built there


def test_stand_ins_read_as_tensors() -> None:
    import torch

    from autoannot import collectives, metadata

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


def test_call_excluded_returns_raises_and_excludes_both_keys_only_during_the_call(
        monkeypatch) -> None:
    import torch

    monkeypatch.setattr(native, "_loaded", [])  # (this process may have looked before the build)
    module = native.load()
    assert module is not None
    keys = tuple(map(torch._C._dispatch_key_parse, ("DeferredInit", "TESTING_ONLY_GenericWrapper")))

    def excluded() -> tuple[bool, ...]:
        return tuple(torch._C._dispatch_tls_is_dispatch_key_excluded(k) for k in keys)

    def seen(*args: Any, **kwargs: Any) -> Any:
        return args, kwargs, excluded()

    sentinel = object()
    assert module.call_excluded(seen, (1, sentinel), {"k": 2}) == ((1, sentinel), {"k": 2},
                                                                  (True, True))
    assert module.call_excluded(seen, (), None) == ((), {}, (True, True))
    assert excluded() == (False, False)  # left as the thread had it

    class Failure(Exception):
        pass

    def fails() -> None:
        raise Failure("the collective's own error")

    with pytest.raises(Failure, match="own error"):
        module.call_excluded(fails, (), None)
    assert excluded() == (False, False)
    torch._C._dispatch_tls_set_dispatch_key_excluded(keys[0], True)  # already excluded: kept
    try:
        module.call_excluded(seen, (), None)
        assert excluded() == (True, False)
    finally:
        torch._C._dispatch_tls_set_dispatch_key_excluded(keys[0], False)
    with pytest.raises(TypeError, match="call_excluded"):
        module.call_excluded(seen, [1], None)


def test_build_native_cli_exit_codes_and_doctor(tmp_path, built) -> None:
    import subprocess
    import sys

    env = dict(os.environ)
    done = subprocess.run([sys.executable, "-m", "autoannot", "build-native"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == str(built)  # built: nothing to do
    doctor = subprocess.run([sys.executable, "-m", "autoannot", "doctor"], env=env,
                            capture_output=True, text=True, timeout=600)
    assert f"native kernel: built ({built})" in doctor.stdout
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
    assert "native kernel: off (AUTOANNOT_NATIVE=0)" in off.stdout

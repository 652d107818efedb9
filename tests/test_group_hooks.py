"""Issue 38: where torch's process groups take collective hooks (torch >= 2.14), they observe
the launches no proxy sees — DDP's reducer, ``pg.*`` calls — for ``record()`` and the record
file, on real gloo ranks, with no kernel of the agent on torch's dispatcher. Each expectation
is counted by a hook of the test's own, registered beside the agent's."""

from __future__ import annotations

import hook_cases as cases
import pytest
from harness import run_job, run_ranks

from autoannot.observe import group_hooks

hooks_here = pytest.mark.skipif(
    not (__import__("torch").distributed.is_available() and group_hooks.available()),
    reason="this torch's process groups take no collective hooks (torch < 2.14)")


def test_doctor_says_whether_this_torch_has_the_hooks() -> None:
    """The feature is detected, not the version: doctor says what this torch has."""
    import torch

    from autoannot.agent import doctor

    said = doctor.diagnose()["group_hooks"]
    has = hasattr(torch._C._distributed_c10d.ProcessGroup, "register_pre_hook")
    assert said.startswith("on this torch") is has
    assert ("take no collective hooks" in said) is not has


WAYS = ["hooks, the key free", "hooks, the key owned by another library",
        "AUTOANNOT_GROUP_HOOKS=0", "native hooks"]


def _native_hooks(request, monkeypatch) -> None:
    """The native module built for this torch (its hooks in C++ stand in for Python's)."""
    from pathlib import Path

    built = request.getfixturevalue("native_build")
    monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(Path(built).parent.parent))
    monkeypatch.setenv("AUTOANNOT_NATIVE", "1")


@hooks_here
@pytest.mark.parametrize("way", WAYS)
def test_record_sees_every_launch_below_the_python_api_once(way: str, monkeypatch,
                                                           request) -> None:
    """The hooks are the observer: every launch the group issued — DDP's buckets (C++, on
    autograd's thread), ``pg.allreduce``, a coalesced op, a launch on another thread — is
    recorded once, with nothing of the agent's on torch's dispatcher, whether or not another
    library (torchdistx) owns the key the Python layer would borrow (before the hooks, that
    recorded none of them: 0 of DDP's buckets). ``AUTOANNOT_GROUP_HOOKS=0``: the older
    observers, as on torch < 2.14 (the Python layer: its own thread's launches only). The
    native hooks hand every launch to the same Python while a recorder is open."""
    hooks_off = way == "AUTOANNOT_GROUP_HOOKS=0"
    monkeypatch.setenv("AUTOANNOT_GROUP_HOOKS", "0" if hooks_off else "1")
    monkeypatch.setenv("AUTOANNOT_NATIVE", "0")
    if way == "native hooks":
        _native_hooks(request, monkeypatch)
    for result in run_ranks(cases.below_the_python_api, 2, args=("owned" in way,)):
        launched = result["counted"]
        # DDP's buckets, 2 pg.allreduce, one coalesced (torch 2.15 says ALLREDUCE_COALESCED)
        allreduces = [name for name in launched if name.startswith("ALLREDUCE")]
        assert len(allreduces) >= 5
        assert all(r[3] == result["group_name"] for r in result["records"])
        sizes = [(r[1], r[2]) for r in result["records"]]
        assert ("allreduce_coalesced", 7) in sizes and ("allreduce", 3) in sizes
        buckets = [r for r in result["records"] if r[0] == "c10d.allreduce_"]
        if hooks_off:
            assert result["layer_made"] and not result["torch_kernels_only"]
            assert ("allreduce", 11) not in sizes  # (another thread: the layer is not there)
            continue
        assert len(result["records"]) == len(launched)  # every launch, once
        assert ("allreduce", 11) in sizes
        assert len(buckets) == len(allreduces) - 1  # (less the coalesced one)
        assert not result["layer_made"] and not result["native_observer"]
        assert result["native_hooks"] is (way == "native hooks")
        assert result["torch_kernels_only"]
        assert result["hooks_on_after"] is False  # (they record no more once it closed)


@hooks_here
def test_the_record_file_has_each_launch_below_the_python_api_once(tmp_path) -> None:
    """A job run as users run it (``AUTOANNOT=1``, ``AUTOANNOT_RECORD``)."""
    for result in run_job(cases.journal_of_a_job, 2, tmp_path, (str(tmp_path),)):
        hooked = [api for api, _ in result["journal"] if api.startswith("c10d.")]
        assert len(hooked) == len(result["counted"]) > 0  # DDP's broadcasts and all-reduces


EXITS_WITH_A_GROUP_ALIVE = """
import os
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
import autoannot
autoannot.enable()
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
with autoannot.record() as records:
    dist.group.WORLD.allreduce([torch.ones(2)]).wait()
print(len(records))
from autoannot.agent.instrumentation import INSTRUMENTATION  # (whose hooks ran: as asked)
native = INSTRUMENTATION.hooks.native
assert (native is not None) is (os.environ.get("AUTOANNOT_NATIVE") == "1"), native
"""


@hooks_here
@pytest.mark.parametrize("hooks", ["python", "native"])
def test_a_process_that_never_destroys_its_group_exits_cleanly(hooks: str, monkeypatch,
                                                               request) -> None:
    """A hooked group outliving the interpreter freed the hooks after Python was gone: the
    process crashed at exit (SIGSEGV, rc 139) — what most jobs do (no
    ``destroy_process_group``). The hooks come off at exit."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if hooks == "native":
        _native_hooks(request, monkeypatch)
    done = subprocess.run([sys.executable, "-c", EXITS_WITH_A_GROUP_ALIVE],
                          cwd=Path(__file__).parents[1], capture_output=True, text=True,
                          timeout=300, env=os.environ.copy())
    assert (done.returncode, done.stdout.strip()) == (0, "1"), done.stderr[-2000:]


@hooks_here
@pytest.mark.parametrize("torch_annotates", [False, True],
                         ids=["the agent alone", "torch's collective annotations on too"])
def test_a_capture_annotates_each_collective_once(torch_annotates: bool) -> None:
    """In a capture the hooks annotate what no proxy sees (DDP's buckets, ``pg.*``) as the
    proxies annotate theirs: one ``mark_kernels`` scope per collective, and one ledger entry.
    With torch's collective annotations on too (a stand-in of its public contract: its own
    hooks entering ``mark_kernels`` with a subset of the fields), each collective still gets
    one bracket — torch's scope nested in the agent's, which ``mark_kernels`` merges key by
    key into one annotation per kernel: the union of the fields."""
    for result in run_ranks(cases.captured_with_torchs_annotations, 2,
                            args=(torch_annotates,)):
        assert result["observer"] == "hooks"
        launched, brackets = result["counted"], result["brackets"]
        assert len(brackets) == len(launched) == len(result["ledger"]) >= 4
        assert [e[0] for e in result["ledger"]].count("c10d.allreduce_") == (
            launched.count("ALLREDUCE") - 1)  # DDP's buckets and pg.allreduce (and the proxy's)
        assert result["ledger"][-1] == ["all_reduce", 5]
        for bracket in brackets:
            who = [scope[0] for scope in bracket]
            assert who == (["autoannot", "torch"] if torch_annotates else ["autoannot"])
            merged: dict = {}
            for _, annotation in bracket:  # (mark_kernels: the inner scope wins common keys)
                merged.update(annotation)
            ours = bracket[0][1]
            assert set(merged) == set(ours) | (set(bracket[1][1]) if torch_annotates else set())
            assert {"name", "stream", "Process Group Ranks", "In split size"} <= set(merged)
            if torch_annotates:
                assert {"Is asynchronized op", "Rank"} <= set(merged)
                assert merged["In msg nelems"] == ours["In msg nelems"]  # (the same launch)

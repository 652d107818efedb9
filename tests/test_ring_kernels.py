"""The always-on ring's launches made below the Python API on a torch whose process groups
take no hooks, written by the native module's c10d kernels (``native/ring_kernels.cpp``) while
one ring is all that is open; and by the Python layer without the module. Planted truth on real
gloo ranks: DDP's own account of its buckets, and calls at lines the case knows."""

from __future__ import annotations

from pathlib import Path

import native_cases as cases
import pytest
from harness import forked_ring, run_ranks

from autoannot.base.ring_format import FAILED


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_the_ring_holds_each_launch_below_the_python_api_at_its_line(native: bool, monkeypatch,
                                                                     tmp_path,
                                                                     native_build) -> None:
    """Each DDP bucket all-reduce (a backward's launches are DDP's rebuilt buckets), each
    ``pg.allreduce`` (another thread's too) and each proxied call is in the ring once, in its
    group's order with consecutive seqs, at its line; a launch that raised in gloo is there as
    failed, and raised what the agent off raises; with a recorder open the launch is recorded
    and in the ring once. Through the kernels, no operator is watched while the ring is alone
    open, and every launch of a key seen before is written with no Python call; after
    ``disable()`` no kernel of ours is on torch's dispatcher."""
    monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(Path(native_build).parent.parent))
    monkeypatch.setenv("AUTOANNOT_NATIVE", "1" if native else "0")
    for result in run_ranks(cases.ring_below_the_python_api, 2, args=(str(tmp_path / "r"),)):
        assert result["native"] is native
        launches, lines = result["launches"], result["lines"]
        assert result["count"] == len(launches)  # (each launch once: no kernel and callback both)
        here = f"{Path(result['file']).resolve()}:{{}}"
        mine = [launch for launch in launches[result["before"]:] if launch[0] == result["group"]]
        first = mine[0][1]
        assert [launch[1] for launch in mine] == list(range(first, first + len(mine)))
        buckets = result["bucket_bytes"]
        assert len(buckets) >= 2
        step = len(buckets) + 2
        for at in range(0, 3 * step, step):
            assert sorted(launch[3] for launch in mine[at:at + len(buckets)]) == buckets
        sites = ([here.format(lines["backward"])] * len(buckets)
                 + [here.format(lines["pg.allreduce"]), here.format(lines["dist.all_reduce"])])
        assert [(launch[2], launch[4]) for launch in mine] == [
            *[("allreduce", site) for site in sites * 3],
            ("allreduce", here.format(lines["thread"])),
            ("all_gather", here.format(lines["raised"])),
            ("allreduce", here.format(lines["recorded"]))]
        assert [launch[3] for launch in mine[step - 2:step]] == [3 * 4, 5 * 4]
        # (a launch's size: the larger of its in and out messages; the gather's, 2 ranks' 2)
        assert [launch[3] for launch in mine[-3:]] == [11 * 4, 2 * 2 * 4, 3 * 4]
        at_raised = len(launches) - 2  # (the group's last two launches are the ring's last two)
        assert result["returned"][at_raised] == FAILED
        assert all(r >= e > 0 for i, (e, r) in enumerate(zip(result["entered"],
                                                             result["returned"], strict=True))
                   if i != at_raised)
        assert result["raised"] is not None and result["raised"] == result["raised_off"]
        others = [launch for launch in launches if launch[0] == result["other"]]
        assert [(o[1], o[2], o[3], o[4]) for o in others] == [
            (0, "allreduce", 13 * 4, here.format(lines["other group"]))]
        assert result["recorded"] == [[3, here.format(lines["recorded"])]]
        assert result["kernel_after_disable"] is False
        if native:
            assert result["operators_watched"] is False
            # Written by the kernels with no Python call: every bucket (their keys known
            # since the warm-up steps) and pg.allreduce but its first (a new key); not the
            # proxy's (its own), the thread's, the other group's or the raising one (new keys).
            assert result["written"] == 3 * len(buckets) + 2



def test_a_forked_child_writes_a_ring_of_its_own(monkeypatch, tmp_path, native_build) -> None:
    """A child forked while the c10d kernels write the parent's ring (a DataLoader worker)
    opens its own at its first launch, with its own sequence numbers (the key the kernels knew
    is asked of Python again there); the parent's ring goes on from where it was, with no
    record of the child's."""
    from autoannot.traces.read import ring_files

    monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(Path(native_build).parent.parent))
    said, parent, child = forked_ring(tmp_path / "rings",
                                      "INSTRUMENTATION.observer.module.ring_kernel_counts()[0]")
    assert said["attached"] and said["child"] == 0 and said["count"] == 4
    assert said["written_here"] == 3  # (the first a new key: Python's; the child's not counted)
    assert [int(s) for s in ring_files.read(parent).records["seq"]] == [0, 1, 2, 3]
    assert [int(s) for s in ring_files.read(child).records["seq"]] == [0, 1]
    assert ".pid" in child.name


def test_the_kernels_step_aside_where_another_kernel_is_on_their_key(monkeypatch, tmp_path,
                                                                     native_build) -> None:
    """Another library's kernel on ``c10d::allreduce_`` at ``BackendSelect`` (registered
    first): no kernel of ours stays on torch's dispatcher, it is said once, and every launch
    is in the ring at its line all the same (the operators' callback, watching again), having
    run through the other kernel. Before: the other ops' kernels stayed and the callback was
    off, so the all-reduces went unwritten."""
    monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(Path(native_build).parent.parent))
    (result,) = run_ranks(cases.ring_beside_a_kernel_of_anothers, 2, "fake",
                          args=(str(tmp_path / "r"),), ranks=(0,))
    assert result["kernels"] == [] and result["watched"] is True
    assert result["theirs"] == 3
    assert [s for s in result["said"] if "BackendSelect" in s] == [
        "autoannot: the ring's launches below the Python API are seen through the native "
        "observer's callback on every operator: another kernel is on torch's BackendSelect key "
        "for c10d::allreduce_"]
    here = f"{Path(result['file']).resolve()}:{{}}"
    assert result["launches"] == [["allreduce", 3 * 4, here.format(line)]
                                  for line in result["lines"]]

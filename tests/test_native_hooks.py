"""Torch's process-group hooks in C++ (``native/ring_hooks.cpp``): where the native module is
built for a torch whose groups take hooks (>= 2.14), its hooks stand in for Python's and write
the always-on ring themselves. Planted truth on real gloo ranks: what each group launched (a
hook of the test's own), and at which line."""

from __future__ import annotations

from pathlib import Path

import hook_cases as cases
import pytest
from harness import forked_ring, run_ranks

from autoannot.base import features

hooks_here = pytest.mark.skipif(
    not (__import__("torch").distributed.is_available() and features.group_hooks_available()),
    reason="this torch's process groups take no collective hooks (torch < 2.14)")


def _with_native(monkeypatch, native_build: Path) -> None:
    monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(Path(native_build).parent.parent))
    monkeypatch.setenv("AUTOANNOT_NATIVE", "1")
    monkeypatch.setenv("AUTOANNOT_GROUP_HOOKS", "1")


@hooks_here
@pytest.mark.parametrize("hooks", ["native", "python"])
def test_the_ring_holds_each_launch_at_its_line_in_order(hooks: str, monkeypatch, tmp_path,
                                                         native_build) -> None:
    """Every launch each group issued is in the ring once, in order, with its group's seq,
    its collective and size, the line that launched it (DDP's buckets: the ``backward()``
    line) and a return after its entry — whether the native hooks wrote it (most launches,
    after the first of each kind and call site) or Python's hooks did, a recorder open or
    not."""
    _with_native(monkeypatch, native_build)
    if hooks == "python":
        monkeypatch.setenv("AUTOANNOT_NATIVE", "0")
    for result in run_ranks(cases.ring_of_a_job, 2, args=(str(tmp_path / "rings"),)):
        assert result["native"] is (hooks == "native")
        launches, lines = result["launches"], result["lines"]
        assert result["count"] == len(launches)  # (every launch a collective's: one each)
        launches = launches[result["before"]:]
        here = f"{Path(result['file']).resolve()}:{{}}"
        mine = [launch for launch in launches if launch[0] == result["group"]]
        # the group's launches in the order the test's hook counted them, seq 0, 1, ...
        assert [(launch[2], launch[3] // 4) for launch in mine] == [
            ("allreduce", size) for size in result["sizes"]]
        first = mine[0][1]
        assert [launch[1] for launch in mine] == list(range(first, first + len(mine)))
        buckets = (len(result["sizes"]) - 2) // 3 - 2  # (steps of buckets, pg, dist; 2 more)
        expected_sites = ([here.format(lines["backward"])] * buckets
                          + [here.format(lines["pg.allreduce"]),
                             here.format(lines["dist.all_reduce"])]) * 3
        assert buckets >= 2
        assert [launch[4] for launch in mine] == [*expected_sites, here.format(lines["thread"]),
                                                  here.format(lines["recorded"])]
        # (a recorder open too: the launch recorded, and in the ring, by Python's path)
        assert result["recorded"] == [[3, here.format(lines["recorded"])]]
        others = [launch for launch in launches if launch[0] == result["other"]]
        assert [(o[1], o[2], o[3], o[4]) for o in others] == [
            (0, "allreduce", 13 * 4, here.format(lines["other group"]))]
        assert all(result["returned_after_entry"])
        # Written by the native hooks with no Python call: every bucket (its kinds known
        # since the set-up steps; a new line's id asked of Python inline), and pg.allreduce
        # but its first (a new kind: Python derives it); not the proxy's launches, the
        # thread's or the other group's (new kinds).
        assert result["written_here"] == (3 * buckets + 2 if hooks == "native" else 0)



@hooks_here
def test_a_forked_child_writes_a_ring_of_its_own(monkeypatch, tmp_path, native_build) -> None:
    """A child forked while the native writer writes the parent's ring (a DataLoader worker)
    opens its own at its first launch, with its own sequence numbers; the parent's ring goes on
    from where it was, with no record of the child's."""
    from autoannot.traces.read import ring_files

    _with_native(monkeypatch, native_build)
    said, parent, child = forked_ring(tmp_path / "rings",
                                      "INSTRUMENTATION.hooks.native.hook_counts()[0]")
    assert said["attached"] and said["child"] == 0 and said["count"] == 4
    assert said["written_here"] == 3  # (the first a new kind: Python's; the child's not counted)
    assert [int(s) for s in ring_files.read(parent).records["seq"]] == [0, 1, 2, 3]
    assert [int(s) for s in ring_files.read(child).records["seq"]] == [0, 1]
    assert ".pid" in child.name

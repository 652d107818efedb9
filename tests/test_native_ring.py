"""The Python API's launches written to the always-on ring by the native module's C wrapper
(``handoff_wrapper``'s ring path, ``observe/native_ring.py``): on every torch the module builds
for (the native observer's module before 2.14, the native hooks' after). Planted truth on real
gloo ranks: what each call launched, and at which line."""

from __future__ import annotations

from pathlib import Path

import native_cases as cases
import pytest
from harness import run_ranks

from autoannot.base.ring_format import FAILED


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_the_ring_holds_each_python_api_launch_at_its_line_in_order(native: bool, monkeypatch,
                                                                    tmp_path,
                                                                    native_build) -> None:
    """Each call is in the ring once, in order, with its group's seq, its collective, its
    size, its line (another thread's too), and a return after its entry; a call that raised in
    the process group is there as failed, with what the agent off raises — whether the C
    wrapper wrote it (every launch of a key after its first) or the Python wrapper did
    (AUTOANNOT_NATIVE=0)."""
    monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(Path(native_build).parent.parent))
    monkeypatch.setenv("AUTOANNOT_NATIVE", "1" if native else "0")
    world = 2
    for result in run_ranks(cases.proxies_ring, world, args=(str(tmp_path / "rings"),)):
        assert result["native"] is native
        here = f"{Path(result['file']).resolve()}:{{}}"
        main, sub = result["world_group"], result["sub"]
        # (a launch's size: the larger of its in and out messages, in bytes)
        step = [(main, "allreduce", 2 * 8 * 4), (main, "_allgather_base", world * 2 * 8 * 4),
                (main, "_reduce_scatter_base", 3 * world * 4), (sub, "broadcast", 5 * 8),
                (sub, "allreduce", 6 * 4)]
        planted = [*step * 3, (main, "allreduce", 2 * 8 * 4), (main, "allreduce", 2 * 8 * 4)]
        launches = result["launches"]
        assert [(g, c, size) for g, _, c, size, _ in launches] == planted
        assert [site for *_, site in launches] == [here.format(line) for line in result["lines"]]
        seqs: dict[str, int] = {}
        for group, seq, *_ in launches:  # (each group's launches numbered 0, 1, ... in order)
            assert seq == seqs.get(group, 0)
            seqs[group] = seq + 1
        assert all(r >= e > 0 for e, r in zip(result["entered"][:-1], result["returned"][:-1],
                                              strict=True))
        assert result["returned"][-1] == FAILED
        assert result["raised"] is not None and result["raised"] == result["raised_off"]
        assert result["inside_after"] == {}
        assert result["work"] != "NoneType"  # (the async call's Work, returned)
        # Written in C with no Python call: every launch of the last two steps (each key's
        # first, in the first step, is the Python wrapper's: it tells the key's ids), the other
        # thread's, and the call that raised (their keys known).
        assert result["written"] == (11 if native else 0)
        assert result["written_all"] == (12 if native else 0)

"""The always-on ring keeps each replay of a captured graph: a record for each launch of the
graph's ledger, each its group's next seq, entered and returned as the replay was — written by
Python or by the native writer (``ring_write``) alike. Planted truth on real gloo ranks (a
stand-in graph class: this machine has no CUDA): which collectives the graph holds and at
which lines, when each replay was called, which rank was late to its replays and by how much,
and a replay that raised."""

from __future__ import annotations

from pathlib import Path

import pytest
import replay_cases as cases
from harness import run_ranks

from autoannot.base.ring_format import FAILED
from autoannot.live import progress as rank_progress
from autoannot.live import tally as ring_tally
from autoannot.live import watch
from autoannot.traces.analysis import stragglers
from autoannot.traces.read import ring_files

STEPS, LATE_S = 20, 0.03


@pytest.mark.parametrize("native, late_rank", [(True, 1), (False, 1), (False, -1)],
                         ids=["native-late-rank-1", "python-late-rank-1", "python-none-late"])
def test_each_replay_is_in_the_ring_as_its_graphs_launches(native: bool, late_rank: int,
                                                           monkeypatch, tmp_path,
                                                           native_build) -> None:
    monkeypatch.setenv("AUTOANNOT_NATIVE_DIR", str(Path(native_build).parent.parent))
    monkeypatch.setenv("AUTOANNOT_NATIVE", "1" if native else "0")
    world = 2
    folder = tmp_path / "rings"
    results = run_ranks(cases.replayed_steps, world,
                        args=(str(folder), late_rank, LATE_S, STEPS))
    for result in results:
        here = f"{Path(result['file']).resolve()}:{{}}"
        main, sub, sync = result["world_group"], result["sub"], result["sync"]
        captured = [(main, "allreduce", 2 * 8 * 4, here.format(result["lines"][0])),
                    (main, "_allgather_base", world * 2 * 8 * 4, here.format(result["lines"][1])),
                    (sub, "allreduce", 3 * 8, here.format(result["lines"][2]))]
        eager = [(sync, "allreduce", 4, here.format(line)) for line in result["lines"][3:]]
        planted = [*captured]
        for step in range(STEPS):
            planted += [*captured, eager[step]]
        planted += captured  # (the replay that raised)
        launches = result["launches"]
        assert [(g, c, size, site) for g, _, c, size, site in launches] == planted
        seqs: dict[str, int] = {}
        for group, seq, *_ in launches:  # (each group's launches numbered 0, 1, ... in order)
            assert seq == seqs.get(group, 0)
            seqs[group] = seq + 1
        # The capture's launches and the eager ones are of no graph; each replayed one is the
        # graph's, entered and returned with its replay (the three of one replay alike).
        graphs = result["graphs"]
        assert graphs[:3] == [None] * 3 and result["graph"] is not None
        for step, (before, after) in enumerate(result["around"]):
            at = 3 + 4 * step
            assert graphs[at:at + 3] == [result["graph"]] * 3
            assert len(set(result["entered"][at:at + 3])) == 1
            assert before <= result["entered"][at] <= after
            returned = set(result["returned"][at:at + 3])
            if step < STEPS:
                assert graphs[at + 3] is None
                assert len(returned) == 1
                assert result["entered"][at] + 2_000_000 <= returned.pop() <= after
            else:
                assert returned == {FAILED}
        assert result["raised"] == "replay failed (planted)"
        assert result["wrapped_while_open"] and result["unwrapped_once_closed"]
        assert result["restored"]
        # Written by the native writer once the ring's first eager launch attached it.
        assert all(result["writer_at_replays"][1:]) is native
    # Counted as the watch's metrics count: every replayed launch once, and no time in
    # collectives for any (each replay took 2 ms: 21 replays would add 42 ms to each group).
    main, sub = results[0]["world_group"], results[0]["sub"]
    for rank, result in enumerate(results):
        tally = ring_tally.Tally()
        tally.update(folder / f"rank{rank}.ring")
        assert tally.launches[(sub, "allreduce")] == 1 + STEPS + 1
        assert tally.launches[(main, "_allgather_base")] == 1 + STEPS + 1
        captured_sub = (result["returned"][2] - result["entered"][2]) / 1e9  # (its one launch
        assert tally.seconds[sub] == pytest.approx(captured_sub, abs=1e-6)  # not replayed)
    # The rank late to its replays is named in the graph's two groups, by about its delay;
    # not in the eager launches' group, where it waited no longer outside than the others.
    # Read from the rings on this host, and from the progress documents ranks publish to a
    # store (another host's watcher) alike.
    # (one window of the 20 replays names it here: the rule's persistence over windows and
    # seconds is the watch's tests')
    rule = {"windows": 1, "span_s": 0.0}
    tails = watch.tails_of_rings(folder)
    found = {(s.rank, s.group): s for s in stragglers.persistent(
        tails.entered, tails.members, tails.gaps, tails.clocks, **rule)}
    documents = [rank_progress.of_ring(ring_files.read(folder / f"rank{rank}.ring"), watch.TAIL)
                 for rank in range(world)]
    published = rank_progress.tails_of(documents)
    assert {(s.rank, s.group) for s in stragglers.persistent(
        published.entered, published.members, published.gaps, published.clocks, **rule)
            } == set(found)
    if late_rank < 0:
        assert found == {}
    else:
        graph_groups = {results[0]["world_group"], results[0]["sub"]}
        assert set(found) == {(late_rank, group) for group in graph_groups}
        for straggler in found.values():
            assert 0.6 * LATE_S * 1e6 <= straggler.late_by_us <= 2 * LATE_S * 1e6, straggler

"""What the ring's per-replay records cost the host: a replay call of a captured graph of
``--launches`` all-reduces, with the agent off, on with no ring (the replay runs torch's own
method), and on with the ring open (each replay writes a record a launch: in Python, and
through the native writer where it is built).

    PYTHONPATH=. python benchmarks/replay_ring_cost.py [--launches 16] [--replays 20000]
        [--rounds 7] [-o OUT.json]

No CUDA: a stand-in graph class (its ``replay`` does nothing: what is timed is the agent's
part alone, the host's time a real replay adds to) with the agent's own ``CUDAGraph`` wrappers,
its ledger captured from ``dist.all_reduce`` on a fake group of 2 (one process). The modes are
alternated ``--rounds`` times in this process; the median of each mode's rounds, in us a
replay and a launch. Native: ``AUTOANNOT_NATIVE_DIR`` where ``autoannot build-native`` put the
module (its mode is left out where none is built).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _time(graph: Any, replays: int) -> float:
    """us a replay call."""
    replay = graph.replay
    start = time.perf_counter()
    for _ in range(replays):
        replay()
    return (time.perf_counter() - start) * 1e6 / replays


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=16)
    parser.add_argument("--replays", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("-o", "--output")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import autoannot
    from autoannot.agent import graph_patches
    from autoannot.agent.instrumentation import INSTRUMENTATION as agent
    from autoannot.keep.ring import Ring

    sys.path.insert(0, str(Path(__file__).parent))
    import overhead

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    agent.captures.by_thread()
    autoannot.enable()
    graphs = overhead.stand_in_graphs()
    patches = graph_patches.install(graphs, agent)
    graph = graphs.CUDAGraph()
    x = torch.ones(1024)
    graph.capture_begin()
    for _ in range(args.launches):
        dist.all_reduce(x)
    graph.capture_end()
    ledger = agent.captures.ledger_of(graph)
    assert ledger is not None and len(ledger.entries) == args.launches, "no ledger"
    native = agent.proxies_native_module()
    folder = tempfile.mkdtemp(prefix="autoannot-replay-cost-")
    modes = ["agent off", "agent on, no ring", "ring (Python)"]
    if native is not None:
        modes.append("ring (native writer)")
    times: dict[str, list[float]] = {m: [] for m in modes}
    written: dict[str, int] = {}
    for r in range(args.rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            ring = None
            if mode == "agent off":
                autoannot.disable()
            elif mode.startswith("ring"):
                ring = Ring(f"{folder}/{r}-{len(written)}", 1 << 16)
                agent.state.open_journal(ring)
                if mode.endswith("(native writer)") and not ring.attach_writer(native):
                    raise SystemExit("the native writer could not be attached")
            count = ring.count if ring is not None else 0
            times[mode].append(_time(graph, args.replays))
            if ring is not None:
                written[mode] = (ring.count - count) // args.replays
                agent.state.close_journal(ring)
                ring.close()
            if mode == "agent off":
                autoannot.enable()
                graph_patches.install(graphs, agent)
    for patch in reversed(patches):
        patch.undo()
    autoannot.disable()
    medians = {m: statistics.median(t) for m, t in times.items()}
    off = medians["agent off"]
    print(f"a replay of a graph of {args.launches} all-reduces (stand-in, no CUDA), "
          f"median of {args.rounds} rounds x {args.replays} replays, torch {torch.__version__}")
    print(f"{'mode':24} {'us a replay':>12} {'added':>8} {'added a launch':>15} {'records':>8}")
    for mode in modes:
        added = medians[mode] - off
        print(f"{mode:24} {medians[mode]:12.3f} {added:8.3f} {added / args.launches:15.3f} "
              f"{written.get(mode, 0):8}")
    result = {"torch": torch.__version__, "launches": args.launches, "replays": args.replays,
              "rounds": args.rounds, "us_a_replay": medians,
              "records_a_replay": written, "samples": times}
    if args.output:
        with open(args.output, "x") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

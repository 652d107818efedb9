"""What the agent adds to a call, counted in CPU instructions (valgrind's callgrind): exact and
repeatable where a shared machine's timings are not.

    python benchmarks/instructions.py [--calls N] [-o OUT.json]

Each mode below runs N calls of ``dist.all_reduce`` on a fake group of 2 ranks (no
communication: the pure overhead) between callgrind's start and stop requests; the same loop
with the unwrapped call is the baseline. Modes: a bare wrapt pass-through (any wrapt proxy's
floor), the agent on with nothing to do (the fast path), annotating (a recorder open), a record file
open (``AUTOANNOT_RECORD``: a JSON line a launch), the ring open (``AUTOANNOT_RING``; these two
for ``pg.allreduce`` too), the
tutorial's hand-written helper around the call, in a stand-in capture (as this install
annotates there: handed to the native observer where it is built) and through the Python
wrappers; ``pg.allreduce`` (a launch no proxy sees, as DDP's reducer's) with the agent off, on
and idle, and in a stand-in capture (noted in its ledger by whichever observer this install has
below the Python API); a decoder's set of 8 stand-in captures of 64 all-reduces each (the
launches alone, agent off); then one ``CUDAGraph.replay()`` of a stand-in graph class
instrumented as torch's, agent off and on, with no profiler. The garbage collector is off while
counting (a collection's cost is the heap's, mostly torch's modules, not the call's; a
recorder's records add to what it tracks). ``AUTOANNOT_NATIVE=0``: without the native observer;
``AUTOANNOT_GROUP_HOOKS=0``: not through torch's process-group hooks (>= 2.14). Needs valgrind,
its headers and a C compiler (it compiles a 2-line helper that makes callgrind's client
requests). Prints a table, then one line of JSON. A benchmark, not a test: it never fails on a
figure."""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HELPER = """#include <valgrind/callgrind.h>
void counting_start(void) {
  CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; CALLGRIND_TOGGLE_COLLECT;
}
void counting_stop(const char* name) {
  CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS_AT(name); CALLGRIND_STOP_INSTRUMENTATION;
}
"""
HEADER = Path("/usr/include/valgrind/callgrind.h")
DECODER_LAUNCHES = 64  # all-reduces a graph, 8 graphs (benchmarks/gpu_capture.py's decoder)


def _decoder_sets(calls: int) -> int:
    """Decoder sets counted (each is 512 launches: fewer than the single calls)."""
    return max(2, calls // 200)


def _missing() -> str:
    """What this machine lacks to count ('' when nothing)."""
    missing = [tool for tool in ("valgrind", "cc") if shutil.which(tool) is None]
    if not HEADER.exists():
        missing.append(f"valgrind's headers ({HEADER})")
    return ", ".join(missing)


def _counted(helper: Any, name: str, call: Callable[[], Any], calls: int) -> None:
    for _ in range(min(calls, 200)):  # warm: caches filled, first-call work done
        call()
    gc.collect()
    gc.disable()  # a collection's cost is the heap's (torch's modules), not the call's
    helper.counting_start()
    for _ in range(calls):
        call()
    helper.counting_stop(name.encode())
    gc.enable()


def child(folder: str, calls: int) -> None:
    """Under callgrind: every mode, each between a start and a stop request."""
    import ctypes

    import torch
    import torch.distributed as dist
    import wrapt
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import autoannot
    from autoannot import testing
    from autoannot.agent import graph_patches
    from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT

    sys.path.insert(0, str(Path(__file__).parent))
    import overhead

    helper = ctypes.CDLL(os.path.join(folder, "counting.so"))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    group = dist.group.WORLD
    tensor = torch.ones(16)
    original = dist.distributed_c10d.all_reduce
    floor = wrapt.FunctionWrapper(original, lambda wrapped, instance, args, kwargs:
                                  wrapped(*args, **kwargs))

    def count(name: str, call: Callable[[], Any], times: int = calls) -> None:
        _counted(helper, name, call, times)

    def tutorial() -> None:
        with overhead.tutorial_helper("all_reduce", tensor, tensor, group):
            original(tensor, group=group)

    def pg_call() -> None:  # a launch no proxy sees (as DDP's reducer's, from C++)
        group.allreduce([tensor]).wait()

    count("pg call, agent off", pg_call)  # (before enable(): no process-group hooks yet)
    autoannot.enable()
    autoannot.disable()
    AGENT.captures.by_thread()  # a stand-in capture is the thread's (no CUDA here)
    count("unwrapped", lambda: original(tensor, group=group))
    count("wrapt floor", lambda: floor(tensor, group=group))
    count("tutorial helper", tutorial)
    autoannot.enable()
    proxy = dist.all_reduce
    count("fast path", lambda: proxy(tensor, group=group))
    with autoannot.record():
        count("annotating", lambda: proxy(tensor, group=group))
    from autoannot.keep.journal import Journal
    from autoannot.keep.ring import Ring

    for name, kept in (("record file line", Journal(f"{folder}/record.jsonl")),
                       ("ring record", Ring(f"{folder}/ring", 4096))):
        AGENT.state.open_journal(kept)
        count(name, lambda: proxy(tensor, group=group))
        count(f"pg call, {name}", pg_call)  # (below the Python API: DDP's launches' path)
        AGENT.state.close_journal(kept)
        kept.close()
    for name, test_capture in (("in capture", 1), ("in capture, Python", 0)):
        with testing.stand_in(test_capture):
            count(name, lambda: proxy(tensor, group=group))
    observer = AGENT.observer
    if observer is not None:  # (a fake group makes no record of a launch: ask its operator,
        observer.module.set_capture_inputs(True)  # as gloo's are asked)
    count("pg call, agent idle", pg_call)
    with testing.stand_in(1) as graph:
        count("pg call, in capture", pg_call)
    noted = len(AGENT.captures.ledger_of(graph).entries)
    Path(folder, "pg_noted").write_text(str(noted))
    if observer is not None:
        observer.module.set_capture_inputs(False)
    # A decoder's graphs: 8 batch sizes, 64 all-reduces each, captured largest first, on a
    # stand-in graph class instrumented as torch's CUDAGraph is (its methods do nothing).
    batches = [torch.ones(size, 64) for size in (128, 64, 32, 16, 8, 4, 2, 1)]
    graphs = overhead.stand_in_graphs()
    patches = graph_patches.install(graphs, AGENT)
    module = AGENT.observer.module if AGENT.observer is not None else None

    def decoder(launch: Callable[..., Any]) -> None:
        for batch in batches:
            graph = graphs.CUDAGraph()
            graph.capture_begin()
            for _ in range(DECODER_LAUNCHES):
                launch(batch, group=group)
            graph.capture_end()

    sets = _decoder_sets(calls)
    if module is not None:
        module.set_test_capture(1)  # every launch is in a capture the observer knows of
    count("decoder set, agent on", lambda: decoder(proxy), sets)
    for patch in reversed(patches):
        patch.undo()
    autoannot.disable()
    count("decoder set, agent off", lambda: decoder(original), sets)
    if module is not None:
        module.set_test_capture(0)
    graph = graphs.CUDAGraph()
    count("replay, agent off", graph.replay)
    autoannot.enable()
    patches = graph_patches.install(graphs, AGENT)
    graph.capture_begin()
    graph.capture_end()
    count("replay, agent on", graph.replay)
    for patch in reversed(patches):
        patch.undo()
    autoannot.disable()
    hooks = AGENT.hooks
    observing = ("native group hooks" if hooks is not None and hooks.native is not None else
                 "group hooks" if hooks is not None else
                 "native observer" if AGENT.observer is not None else "python layer")
    Path(folder, "native").write_text(observing)
    dist.destroy_process_group()


def _totals(folder: str) -> dict[str, int]:
    """Mode -> instructions counted, from callgrind's dumps (one per stop request)."""
    counted = {}
    for dump in Path(folder).glob("callgrind.out.*"):
        text = dump.read_text(errors="replace")
        name = re.search(r"^desc: Trigger: Client Request: (.+)$", text, re.MULTILINE)
        total = re.search(r"^totals: (\d+)", text, re.MULTILINE)
        if name and total:
            counted[name.group(1)] = int(total.group(1))
    return counted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per mode (default 2000)")
    parser.add_argument("-o", "--output", help="also write the JSON line here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.calls)
        return 0
    missing = _missing()
    if missing:
        print(f"instructions.py: cannot count here: no {missing}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="autoannot-instructions-") as folder:
        source = Path(folder, "counting.c")
        source.write_text(HELPER)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(Path(folder, "counting.so")),
                        str(source)], check=True)
        print(f"counting {args.calls} calls a mode under callgrind (about two minutes) ...",
              file=sys.stderr)
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                   f"--callgrind-out-file={folder}/callgrind.out.%p", sys.executable,
                   __file__, "--child", folder, "--calls", str(args.calls)]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        ran = subprocess.run(command, env=env, capture_output=True, text=True)
        if ran.returncode != 0:
            print(ran.stderr[-3000:], file=sys.stderr)
            return 1
        totals = _totals(folder)
        native = Path(folder, "native").read_text()
        pg_noted = int(Path(folder, "pg_noted").read_text())
    order = ["unwrapped", "wrapt floor", "fast path", "annotating", "record file line",
             "ring record", "tutorial helper",
             "in capture", "in capture, Python", "replay, agent off", "replay, agent on"]
    pg_modes = ["pg call, agent off", "pg call, agent idle", "pg call, record file line",
                "pg call, ring record", "pg call, in capture"]
    per_call = {mode: totals[mode] / args.calls for mode in order}
    sets = _decoder_sets(args.calls)
    decoder_added = (totals["decoder set, agent on"] - totals["decoder set, agent off"]) / sets
    base = per_call["unwrapped"]
    added = {mode: round(value - base) for mode, value in per_call.items()
             if not mode.startswith("replay")}
    helper_added = added["tutorial helper"]
    print(f"{'dist.all_reduce, fake group of 2':38} {'instructions a call':>20} {'added':>8}")
    for mode, value in per_call.items():
        if not mode.startswith("replay"):
            print(f"{mode:38} {value:20,.0f} {added[mode]:8,}")
    pg = {mode: totals[mode] / args.calls for mode in pg_modes}
    pg_base = pg["pg call, agent off"]
    print(f"{'pg.allreduce (no proxy), fake group of 2':38} {'instructions a call':>20} "
          f"{'added':>8}   below the Python API: {native}")
    for mode, value in pg.items():
        print(f"{mode:38} {value:20,.0f} {value - pg_base:8,.0f}")
    print(f"  (launches in the capture's ledger: {pg_noted:,} of {args.calls:,} counted, "
          "and the warm-up's)")
    replay_added = per_call["replay, agent on"] - per_call["replay, agent off"]
    print(f"{'CUDAGraph.replay() (stand-in), no profiler: added':60} {replay_added:8,.0f}")
    launches = 8 * DECODER_LAUNCHES
    print(f"{'decoder: 8 stand-in captures of 64 all-reduces, added':60} {decoder_added:8,.0f}"
          f" ({decoder_added / launches:,.0f} a launch, the capture's part included)")
    result = {
        "calls": args.calls, "below_the_python_api": native,
        "pg_call_instructions": {m: round(v) for m, v in pg.items()},
        "pg_call_in_capture_added": round(pg["pg call, in capture"] - pg_base),
        "pg_call_idle_added": round(pg["pg call, agent idle"] - pg_base),
        "pg_call_noted_in_ledger": pg_noted,
        "instructions_per_call": {m: round(v) for m, v in per_call.items()},
        "added_over_unwrapped": added,
        "annotating_over_helper": round(added["annotating"] / helper_added, 3),
        "in_capture_over_helper": round(added["in capture"] / helper_added, 3),
        "replay_added": round(replay_added),
        "decoder_set_added": round(decoder_added),
        "decoder_set_added_per_launch": round(decoder_added / launches),
    }
    line = json.dumps(result)
    print(line)
    if args.output:
        Path(args.output).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A real 2-rank gloo job whose collectives gloo may start out of order: each step launches two
all-reduces of different sizes with ``async_op=True`` (as DDP's buckets and transformers'
Trainer do), which the group's two worker threads pick up at once, so the second one's
profiler range sometimes starts first. The profiler records shapes (``record_shapes=True``):
each range then says its input's size, the identity the rows' join goes by.

``python tests/async_gloo_job.py OUT [STEPS]`` runs it by hand (``AUTOANNOT=1``,
``AUTOANNOT_RECORD``); ``tests/data/gloo_async/`` is one run's output, where ranges swapped.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

WORLD = 2
SMALL, LARGE = 1000, 200_000  # elements of the two all-reduces of a step


def train(rank: int, world: int, out: str, steps: int, shapes: bool = True) -> dict[str, Any]:
    """``steps`` steps of two async all-reduces, every step profiled; the trace exported.
    The truth of each step: the thread each Work completed on (the thread its future ran the
    user's own callback on: gloo's worker thread that ran it, or this thread where it had
    completed before the callback was added), in ``completions_rank{R}.json``: per step,
    size in bytes -> thread id; and this thread's id."""
    import json
    import threading

    from torch.profiler import ProfilerActivity, profile

    import autoannot

    assert autoannot.is_enabled(), "AUTOANNOT=1 must reach the ranks"
    small, large = torch.ones(SMALL), torch.ones(LARGE)
    completed: list[dict[int, int]] = []

    def told(threads: dict[int, int], size: int) -> Any:
        return lambda _: threads.__setitem__(size, threading.get_native_id())

    with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as prof:
        for _ in range(steps):
            threads: dict[int, int] = {}
            first = dist.all_reduce(small, async_op=True)
            second = dist.all_reduce(large, async_op=True)
            first.get_future().add_done_callback(told(threads, SMALL * 4))
            second.get_future().add_done_callback(told(threads, LARGE * 4))
            first.wait()
            second.wait()
            completed.append(threads)
    prof.export_chrome_trace(f"{out}/trace_rank{rank}.json")
    Path(f"{out}/completions_rank{rank}.json").write_text(json.dumps(
        {"main": threading.get_native_id(), "steps": completed}))
    return {"rank": rank}


def run(out: Path, steps: int = 100, shapes: bool = True,
        record: str | None = "rank{rank}.jsonl") -> list[dict[str, Any]]:
    from harness import run_job

    return run_job(train, WORLD, out, (str(out), steps, shapes), record=record)


def swaps(trace: Path) -> int:
    """How many of a trace's gloo ranges started before the range of the all-reduce launched
    ahead of them (the large one's before the small one's)."""
    import json

    events = json.loads(trace.read_text())["traceEvents"]
    ranges = sorted((e for e in events if str(e.get("name", "")).startswith("gloo:")),
                    key=lambda e: e["ts"])
    sizes = [e["args"]["Input Dims"][0][0] for e in ranges]
    return sum(1 for i in range(0, len(sizes) - 1, 2) if sizes[i] == LARGE)


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    run(target, int(sys.argv[2]) if len(sys.argv) > 2 else 100)
    print({p.name: swaps(p) for p in sorted(target.glob("trace_rank*.json"))},
          f"{time.monotonic() - started:.1f} s")

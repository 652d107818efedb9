"""What torch's process-group hooks cost a collective (torch >= 2.14): ``pg.allreduce`` (no
proxy: only the hooks see it) on a ``fake`` group (rank 0 of 2, nothing moved: the call's own
cost is torch's dispatch), timed in one process before the agent is on (no hooks), with the
agent on and nothing asking (the hooks return at once), and inside ``record()`` (each launch
derived and recorded).

    python benchmarks/hook_cost.py [--calls 20000]

Prints one line of JSON (microseconds a call, the best of 5 rounds, and the ratios). A
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _per_call(call, calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - started) / calls * 1e6)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import autoannot
    from autoannot.observe import group_hooks

    if not group_hooks.available():
        print(json.dumps({"hooks": False, "torch": torch.__version__}))
        return 0
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    group = dist.group.WORLD
    tensors = [torch.ones(4)]

    def call() -> None:
        group.allreduce(tensors)

    figures = {"torch": torch.__version__, "no_hooks_us": _per_call(call, args.calls)}
    autoannot.enable()  # (the groups there are get the hooks)
    figures["hooks_idle_us"] = _per_call(call, args.calls)
    with autoannot.record() as records:
        figures["hooks_recording_us"] = _per_call(call, args.calls // 10)
    figures["recorded"] = len(records)
    figures = {k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items()}
    figures["idle_ratio"] = round(figures["hooks_idle_us"] / figures["no_hooks_us"], 2)
    figures["recording_ratio"] = round(figures["hooks_recording_us"] / figures["no_hooks_us"], 2)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

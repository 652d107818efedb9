"""A collective's time with the agent idle, ``record()`` open, the ring open and a record file
open, in one process (``dist.all_reduce`` on a fake group of 2: the agent's part alone).

    python benchmarks/ring_cost.py [--calls N]

Prints microseconds a call per mode. A benchmark, not a test: it never fails on a figure."""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

import autoannot
from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT
from autoannot.keep.journal import Journal
from autoannot.keep.ring import Ring


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    tensor = torch.ones(16)
    autoannot.enable()
    call = dist.all_reduce

    def per_call() -> float:
        for _ in range(500):
            call(tensor)
        started = time.perf_counter()
        for _ in range(args.calls):
            call(tensor)
        return (time.perf_counter() - started) / args.calls * 1e6

    with tempfile.TemporaryDirectory(prefix="autoannot-ring-cost-") as folder:
        print(f"agent on, idle  {per_call():6.2f} us a call")
        with autoannot.record():
            print(f"record() open   {per_call():6.2f} us a call")
        for name, kept in (("ring open      ", Ring(f"{folder}/rings", 4096)),
                           ("record file    ", Journal(f"{folder}/record.jsonl"))):
            AGENT.state.open_journal(kept)
            print(f"{name} {per_call():6.2f} us a call")
            AGENT.state.close_journal(kept)
            kept.close()
    autoannot.disable()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

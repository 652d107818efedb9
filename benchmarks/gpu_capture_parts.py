"""On one GPU (a 1-rank NCCL group): where a captured Python-API launch's added time goes.

    PYTHONPATH=. python benchmarks/gpu_capture_parts.py [OUT.json]

One graph of 512 ``dist.all_reduce`` captured again and again, in alternating rounds:
agent off; agent off with the native observer registered for captures (torch's Work ranges
seen, their launches noted: what the observer alone costs); agent on (the proxies hand their
launches to the observer). Medians per capture, and per launch over agent off.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import autoannot
from autoannot.instrumentation import INSTRUMENTATION as AGENT

LAUNCHES, ROUNDS = 512, 15


def main(out: str | None) -> int:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29688")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    tensors = [torch.ones(1024, device="cuda") for _ in range(LAUNCHES)]
    autoannot.enable()

    module = AGENT.observer.module if AGENT.observer is not None else None

    def body() -> None:
        for t in tensors:
            dist.all_reduce(t)

    def capture() -> float:
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.cuda.graph(graph):
            body()
        took = time.perf_counter() - start
        if module is not None:
            module.drain(-1)
        return took * 1e3

    def mode(name: str) -> None:
        if name == "off":
            autoannot.disable()
        elif name == "observer alone":
            autoannot.disable()
            module.set_demand(True, False, False)
        else:
            autoannot.enable()

    names = ["off", "on"] + (["observer alone"] if module is not None else [])
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(ROUNDS):
        for name in names:
            mode(name)
            capture()  # warm-up after the switch
            times[name].append(capture())
            if module is not None:
                module.set_demand(False, False, False)
    medians = {n: statistics.median(v) for n, v in times.items()}
    result = {"launches": LAUNCHES, "capture_ms": medians,
              "added_us_per_launch": {n: round((medians[n] - medians["off"]) / LAUNCHES * 1e3, 2)
                                      for n in names},
              "native": module is not None}
    print(json.dumps(result))
    if out:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))

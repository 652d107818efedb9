"""On one GPU: where the first capture of a process goes, agent off against agent on.

    PYTHONPATH=. python benchmarks/gpu_first_capture.py [MODE] [--profile]

MODE: ``off`` or ``on`` (``AUTOANNOT=1``-like: the agent on before torch.distributed is used).
Each run is its own process: a 1-rank NCCL group, eager warm-up of the body (100 all-reduces),
then the first capture of the process, timed (and, with ``--profile``, under cProfile: the
top entries printed). Prints one JSON line. A benchmark, not a test.
"""

from __future__ import annotations

import json
import os
import sys
import time

COLLECTIVES = 100


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else "on"
    profile = "--profile" in argv
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29533"))
    import torch
    import torch.distributed as dist

    if mode == "on":
        import autoannot

        autoannot.enable()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    tensors = [torch.ones(1024, device="cuda") for _ in range(COLLECTIVES)]

    def body() -> None:
        for t in tensors:
            dist.all_reduce(t)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    start = time.perf_counter()
    with torch.cuda.graph(graph):
        body()
    torch.cuda.synchronize()
    first = (time.perf_counter() - start) * 1e3
    if profiler is not None:
        import pstats

        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    graph2 = torch.cuda.CUDAGraph()
    start = time.perf_counter()
    with torch.cuda.graph(graph2):
        body()
    torch.cuda.synchronize()
    second = (time.perf_counter() - start) * 1e3
    print(json.dumps({"mode": mode, "first_capture_ms": round(first, 3),
                      "second_capture_ms": round(second, 3), "profiled": profile}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

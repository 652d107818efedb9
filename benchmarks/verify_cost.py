"""What AUTOANNOT_VERIFY=1 adds to the end of each capture: posting the graph's collective
sequence to the c10d store and comparing it with the other ranks' (2 real gloo ranks, one
host's TCPStore), for graphs of 10, 100 and 1,000 collectives.

    python benchmarks/verify_cost.py
"""
import sys
import time

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "tests"))
from harness import run_ranks


def measure(rank, world, n):
    import torch
    import torch.distributed as dist

    import autoannot
    from autoannot import describe_call
    from autoannot.live import verify
    autoannot.enable()
    ann = describe_call(dist.all_reduce, torch.ones(1024))
    entries = [{"annotation": ann, "call_site": "x.py:1"} for _ in range(n)]
    times = []
    for i in range(20):
        dist.barrier()
        t = time.perf_counter()
        verify.verify_capture(f"g{n}.{i}", entries)
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]

if __name__ == "__main__":
    for n in (10, 100, 1000):
        per_rank = [round(x, 2) for x in run_ranks(measure, 2, "gloo", (n,))]
        print(f"{n} collectives: {per_rank} ms per capture end, per rank (median of 20)")

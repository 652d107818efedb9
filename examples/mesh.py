"""A 2 x 2 mesh of 4 CPU ranks (gloo) to leave the watch on, with no autoannot code in it.

    AUTOANNOT=1 AUTOANNOT_WATCH=1 python examples/mesh.py --late 2
    AUTOANNOT=1 AUTOANNOT_WATCH=1 python examples/mesh.py --stop 3

Each step: an all-reduce in the rank's tensor-parallel group ({0, 1} or {2, 3}), one in its
data-parallel group ({0, 2} or {1, 3}), and a broadcast from rank 0 to all. ``--late R``: rank
R spends 20 ms more before each of its tp all-reduces (a straggler); ``--stop R``: rank R stops,
outside any collective, for 8 seconds after step 5's tp all-reduce (the others wait on it in
their next collectives: a hang while it lasts), then goes on. With ``AUTOANNOT=1
AUTOANNOT_WATCH=1`` rank 0 names either in the job's log while it runs.
"""

from __future__ import annotations

import argparse
import inspect
import os
import socket
import sys
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD, LATE_S, STOP_AFTER, STOP_S = 4, 0.02, 5, 8.0


def group(ranks: list[int], desc: str) -> dist.ProcessGroup:
    """A process group with a description, where this torch takes one."""
    if "group_desc" in inspect.signature(dist.new_group).parameters:
        return dist.new_group(ranks, group_desc=desc)
    return dist.new_group(ranks)


def worker(rank: int, port: int, steps: int, late: int, stop: int) -> None:
    warnings.simplefilter("ignore", FutureWarning)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    tp = [group([0, 1], "tp"), group([2, 3], "tp")][rank // 2]
    dp = [group([0, 2], "dp"), group([1, 3], "dp")][rank % 2]
    x = torch.ones(64)
    for step in range(steps):
        time.sleep(0.002)  # (a step's compute)
        if rank == late:
            time.sleep(LATE_S)
        dist.all_reduce(x, group=tp)
        if rank == stop and step == STOP_AFTER:
            time.sleep(STOP_S)
        dist.all_reduce(x, group=dp)
        dist.broadcast(x, src=0)
    dist.destroy_process_group()
    if rank == 0:
        print(f"rank 0: {steps} steps done")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--late", type=int, default=-1, metavar="RANK",
                        help=f"this rank spends {LATE_S * 1e3:.0f} ms more before each tp "
                        "all-reduce")
    parser.add_argument("--stop", type=int, default=-1, metavar="RANK",
                        help=f"this rank stops for {STOP_S:g} s after step {STOP_AFTER}")
    parser.add_argument("--steps", type=int, default=200, help="steps (default 200)")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, args.steps, args.late, args.stop), nprocs=WORLD)
    return 0


if __name__ == "__main__":
    sys.exit(main())

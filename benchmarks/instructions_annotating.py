"""One mode alone, for comparing two trees: ``dist.all_reduce`` on a fake group of 2 with a
``record()`` open (the hot path that annotates), counted in CPU instructions (callgrind), in a
process that runs nothing else, through the public API only (any version of the agent runs it).

    python benchmarks/instructions_annotating.py TREE [TREE ...] [--calls N]

Each TREE is a folder holding an ``autoannot`` package (``git archive REV autoannot | tar -x
-C TREE``). ``AUTOANNOT_NATIVE`` and ``AUTOANNOT_NATIVE_DIR`` pass through. Prints the
instructions a call per tree, the whole process's counts between the start and stop requests
over the calls (the unwrapped call included). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import instructions  # noqa: E402


def child(helper_path: str, calls: int) -> None:
    import ctypes
    import gc

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import autoannot

    helper = ctypes.CDLL(helper_path)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    group, tensor = dist.group.WORLD, torch.ones(16)
    autoannot.enable()
    proxy = dist.all_reduce
    with autoannot.record():
        for _ in range(200):  # warm: caches filled, first-call work done
            proxy(tensor, group=group)
        gc.collect()
        gc.disable()
        helper.counting_start()
        for _ in range(calls):
            proxy(tensor, group=group)
        helper.counting_stop(b"annotating")


def count(tree: Path, calls: int, helper: Path, folder: Path) -> float:
    """Instructions a call with the ``autoannot`` of ``tree``, dumped into ``folder``."""
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                    f"--callgrind-out-file={folder}/callgrind.out.%p", sys.executable, __file__,
                    "--child", str(helper), "--calls", str(calls)],
                   env=env, check=True, capture_output=True)
    return instructions._totals(str(folder))["annotating"] / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="*", type=Path)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.calls)
        return 0
    with tempfile.TemporaryDirectory(prefix="autoannot-annotating-") as folder:
        source = Path(folder, "counting.c")
        source.write_text(instructions.HELPER)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(Path(folder, "counting.so")),
                        str(source)], check=True)
        helper = Path(folder, "counting.so")
        for i, tree in enumerate(args.trees):
            per_call = count(tree.resolve(), args.calls, helper, Path(folder, str(i)))
            print(f"{tree!s:40} {per_call:12,.0f} instructions a call, record() open")
    return 0


if __name__ == "__main__":
    sys.exit(main())

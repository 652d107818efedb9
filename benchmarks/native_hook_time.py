"""The time the native process-group hooks take inside a training step, measured where they run:
the production benchmark's DDP job (2 gloo ranks, 6 x Linear(256)) with the always-on ring, and
with the agent on and idle, on a build of the native module that sums the time spent in its hooks
(``-DAUTOANNOT_TIME_HOOKS``: two clock reads a hook call; the agent's own build has none).

    python benchmarks/native_hook_time.py [--steps S] [-o OUT.json]

A step's wall time on this 2-core box varies by +-2-4% between rounds, more than the whole cost
asked of the ring (1%): the paired ratio of ``production.py`` cannot resolve it. This measures
the hooks' own part of each step directly: their time a launch and a step, and its share of the
median step. What it leaves out is torch's part (building the hooks' arguments; see
``native_hook_floor.py``) and what the hooks' work costs the rest of the step through the
caches. Needs a C++ compiler and ninja (a build: ~30 s). A benchmark, not a test."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]


def _build() -> None:
    """The timing build, where the agent loads its module from (``AUTOANNOT_NATIVE_DIR``)."""
    import torch.distributed  # noqa: F401  (the hooks are looked for)
    from torch.utils import cpp_extension

    from autoannot import native

    directory = native.build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(name=native.module_name(), sources=[str(p) for p in native.SOURCES],
                       build_directory=str(directory),
                       extra_cflags=[*native.cflags(), "-DAUTOANNOT_TIME_HOOKS"],
                       is_python_module=True)


def _rank(rank: int, world: int, port: int, steps: int, folder: str) -> None:
    import torch
    import torch.distributed as dist
    from production import training_step

    import autoannot
    from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT
    from autoannot.keep.ring import Ring

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    step = training_step("ddp", world)
    result: dict[str, Any] = {}
    for mode in ("agent on, idle", "ring"):
        ring = None
        if mode == "ring":
            ring = Ring(os.path.join(folder, "rings"))
            AGENT.state.open_journal(ring)
        autoannot.enable()
        native = AGENT.hooks.native
        if native is None or not hasattr(native, "hook_time"):
            raise SystemExit("the timing build was not loaded")
        for _ in range(30):
            step()
        dist.barrier()
        ns_before, calls_before = native.hook_time()
        written_before = native.hook_counts()[0]
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        ns, calls = native.hook_time()
        launches = (calls - calls_before) / 2  # (a pre- and a post-hook call each)
        step_s = statistics.median(times)
        hook_s = (ns - ns_before) / 1e9 / steps
        result[mode] = {"median_step_ms": step_s * 1e3, "launches_a_step": launches / steps,
                        "hook_us_a_launch": (ns - ns_before) / 1e3 / launches,
                        "hook_us_a_step": hook_s * 1e6, "share_of_step": hook_s / step_s,
                        "written_in_cpp": (native.hook_counts()[0] - written_before) / launches}
        if ring is not None:
            AGENT.state.close_journal(ring)
            ring.close()
        autoannot.disable()
    Path(folder, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    os._exit(0)  # (past torch's gloo exit race: see tests/harness.py)


def main(argv: list[str] | None = None) -> int:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("-o", "--output", help="also write the JSON line here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))
    from harness import free_port

    with tempfile.TemporaryDirectory(prefix="autoannot-hook-time-") as folder:
        os.environ["AUTOANNOT_NATIVE_DIR"] = os.path.join(folder, "native")
        os.environ["AUTOANNOT_NATIVE"] = "1"
        os.environ.pop("AUTOANNOT_GROUP_HOOKS", None)
        print("building the timing build of the native module (~30 s) ...", file=sys.stderr)
        _build()
        mp.start_processes(_rank, args=(2, free_port(), args.steps, folder), nprocs=2,
                           join=True, start_method="spawn")
        ranks = [json.loads(Path(folder, f"rank{r}.json").read_text()) for r in range(2)]
    import torch

    print(f"DDP, 6 x Linear(256), 2 gloo ranks, {args.steps} steps a mode; time inside the "
          "native hooks (torch's part not included)")
    print(f"{'rank':>4} {'mode':16} {'step ms':>8} {'launches':>9} {'us a launch':>12} "
          f"{'us a step':>10} {'share':>7} {'in C++':>7}")
    for rank, modes in enumerate(ranks):
        for mode, m in modes.items():
            print(f"{rank:>4} {mode:16} {m['median_step_ms']:8.3f} {m['launches_a_step']:9.1f} "
                  f"{m['hook_us_a_launch']:12.2f} {m['hook_us_a_step']:10.1f} "
                  f"{m['share_of_step']:7.2%} {m['written_in_cpp']:7.0%}")
    line = json.dumps({"torch": torch.__version__, "steps": args.steps, "ranks": ranks})
    print(line)
    if args.output:
        with open(args.output, "x") as f:  # (never over another run's figures)
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

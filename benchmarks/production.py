"""What leaving autoannot on costs a training job: median step time of a DDP job on 2 gloo ranks
(a 6-layer MLP, ~7 collectives a step; ``--model fsdp2``: the same MLP under FSDP2's
``fully_shard``, a layer a unit, ~19 collectives a step) with the agent off, on and idle, with
the ring
(``AUTOANNOT_RING``), with the ring and rank 0's watcher (``AUTOANNOT_WATCH``), and with the
record file (``AUTOANNOT_RECORD``) — alternated in one run, in one pair of processes.

    python benchmarks/production.py [--model ddp|fsdp2] [--rounds R] [--steps S] [--width W]
                                    [-o OUT.json]

Each round runs S steps in every mode, the modes in a rotated order each round (no mode is
always first after another), each after a few untimed steps (``--settle``: turning the agent
on and off costs the first steps after it); a mode's figure is the median of its steps over
all rounds, on rank 0 (both ranks wait for each other every step). Memory of the ring: its
file's size (mapped: the pages the kernel keeps). Prints a table, then one line of JSON. A
benchmark, not a test: it never fails on a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MODES = ("agent off", "agent on, idle", "ring", "ring + watch", "record file")


def training_step(kind: str, world: int, width: int = 256, batch: int = 32,
                  bucket_mb: float = 0.25) -> Any:
    """One step of the benchmarks' job (6 x Linear(width) and ReLU, SGD) on the process group
    made already: under DDP (small buckets: several all-reduces a step) or FSDP2
    (``fully_shard`` a layer a unit, on the gloo ranks' CPUs, a GPU host too)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(width, width), nn.ReLU()]
    if kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        model: nn.Module = nn.Sequential(*layers)
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers),
                                                    bucket_cap_mb=bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return step


def paired_ratio(mode: list[float], off: list[float], resamples: int = 2000,
                 seed: int = 0) -> list[float]:
    """The median over rounds of a mode's median step over the agent-off median of the same
    round, and its 95% bootstrap interval (rounds resampled): the machine's drift between
    rounds cancels in a round's own ratio."""
    import random

    ratios = [m / o for m, o in zip(mode, off, strict=True)]
    pick = random.Random(seed)
    medians = sorted(statistics.median(pick.choices(ratios, k=len(ratios)))
                     for _ in range(resamples))
    return [round(statistics.median(ratios), 4), round(medians[int(0.025 * resamples)], 4),
            round(medians[int(0.975 * resamples) - 1], 4)]


def _rank(rank: int, world: int, port: int, args: Any, folder: str) -> None:
    import torch
    import torch.distributed as dist

    import autoannot
    from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT
    from autoannot.keep.journal import Journal
    from autoannot.keep.ring import Ring
    from autoannot.live.watch import Watcher

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    step = training_step(args.model, world, args.width, args.batch, args.bucket_mb)

    rings = os.path.join(folder, "rings")
    modes = [m for m in MODES if m in args.modes]
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}  # (the process's CPU time a step)
    per_round: dict[str, list[float]] = {m: [] for m in modes}  # (each round's median step)
    kept: list[Any] = []
    stop = threading.Event()

    def enter(mode: str) -> None:
        if mode == "agent off":
            return
        # (what is kept is opened before enable(), as AUTOANNOT_RING and AUTOANNOT_RECORD open
        # it at start-up: the launches below the Python API, DDP's reducer's, are seen then)
        if mode.startswith("ring"):
            one = Ring(rings, args.ring)
            AGENT.state.open_journal(one)
            kept.append(one)
            if mode == "ring + watch" and rank == 0:
                stop.clear()
                os.makedirs(rings, exist_ok=True)  # (the ring makes it at its first launch)
                watcher = Watcher(Path(rings), 5.0, lambda line: None)
                threading.Thread(target=watcher.run, args=(1.0, stop), daemon=True).start()
        elif mode == "record file":
            one = Journal(os.path.join(folder, f"rank{rank}.jsonl"))
            AGENT.state.open_journal(one)
            kept.append(one)
        autoannot.enable()

    def leave() -> None:
        stop.set()
        for one in kept:
            AGENT.state.close_journal(one)
            one.close()
        kept.clear()
        autoannot.disable()

    for _ in range(args.warmup):
        step()
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            enter(mode)
            for _ in range(args.settle):  # (untimed: a switch's first steps pay for it)
                step()
            dist.barrier()
            block = []
            for _ in range(args.steps):
                started, started_cpu = time.perf_counter(), time.process_time()
                step()
                block.append(time.perf_counter() - started)
                cpu[mode].append(time.process_time() - started_cpu)
            times[mode] += block
            per_round[mode].append(statistics.median(block))
            leave()
    if rank == 0:
        from autoannot.traces.read import ring_files

        hooks = AGENT.hooks
        observer = ("native hooks" if hooks is not None and hooks.native is not None
                    else "Python hooks" if hooks is not None
                    else "native observer" if AGENT.observer is not None else "Python layer")
        ring_file = Path(rings, "rank0.ring")
        last = ring_files.read(ring_file)  # (the last ring mode's: one block of steps)
        Path(folder, "result.json").write_text(json.dumps({
            "medians_ms": {m: statistics.median(t) * 1e3 for m, t in times.items()},
            "cpu_medians_ms": {m: statistics.median(t) * 1e3 for m, t in cpu.items()},
            "round_ratios": {m: paired_ratio(per_round[m], per_round["agent off"])
                             for m in modes},
            "ring_bytes": ring_file.stat().st_size, "observer": observer,
            "ring_launches_a_step": (last.count - 1) / args.steps,  # (less the barrier)
            "ring_apis": sorted({k["api"] for k in last.kinds.values()})}))
    dist.destroy_process_group()
    os._exit(0)  # (past torch's gloo exit race: see tests/harness.py; the result is written)


def main(argv: list[str] | None = None) -> int:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("ddp", "fsdp2"), default="ddp")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50, help="steps a mode a round")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--settle", type=int, default=3,
                        help="untimed steps after each switch of mode")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--bucket-mb", type=float, default=0.25,
                        help="DDP's bucket size (small: several all-reduces a step)")
    parser.add_argument("--ring", type=int, default=1 << 16, help="the ring's launches")
    parser.add_argument("--modes", default=";".join(MODES),
                        help="the modes to run, separated by ';' ('agent off' always)")
    parser.add_argument("-o", "--output", help="also write the JSON line here")
    args = parser.parse_args(argv)
    args.modes = {"agent off", *(m.strip() for m in args.modes.split(";"))}
    if args.modes - set(MODES):
        parser.error(f"unknown modes: {', '.join(sorted(args.modes - set(MODES)))} "
                     f"(known: {', '.join(MODES)})")
    if not any(m.startswith("ring") for m in args.modes):
        parser.error("the modes need one of the ring's (its size is measured)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from harness import free_port

    with tempfile.TemporaryDirectory(prefix="autoannot-production-") as folder:
        mp.start_processes(_rank, args=(2, free_port(), args, folder), nprocs=2, join=True,
                           start_method="spawn")
        result = json.loads(Path(folder, "result.json").read_text())
    medians = result["medians_ms"]
    base = medians["agent off"]
    print(f"{args.model.upper()}, 6 x Linear({args.width}), 2 gloo ranks: median step of "
          f"{args.rounds} x "
          f"{args.steps} steps a mode, alternated")
    cpu = result["cpu_medians_ms"]
    print(f"{'mode':22} {'step ms':>9} {'x off':>7} {'x off, paired [95%]':>25} "
          f"{'CPU ms':>8} {'CPU x off':>9}")
    for mode in (m for m in MODES if m in medians):
        ratio, low, high = result["round_ratios"][mode]
        print(f"{mode:22} {medians[mode]:9.3f} {medians[mode] / base:7.3f} "
              f"{ratio:9.3f} [{low:.3f}, {high:.3f}] {cpu[mode]:8.3f} "
              f"{cpu[mode] / cpu['agent off']:9.3f}")
    print(f"launches below the Python API seen by: {result['observer']}")
    print(f"ring of {args.ring:,} launches: {result['ring_bytes']:,} bytes a rank (mapped); "
          f"{result['ring_launches_a_step']:g} launches a step kept "
          f"({', '.join(result['ring_apis'])})")
    result.update({"ratios": {m: round(medians[m] / base, 4) for m in medians},
                   "model": args.model, "rounds": args.rounds, "steps": args.steps,
                   "width": args.width,
                   "ring_launches": args.ring})
    import torch

    result["torch"] = torch.__version__
    line = json.dumps(result)
    print(line)
    if args.output:
        with open(args.output, "x") as f:  # (never over another run's figures)
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

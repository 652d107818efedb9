"""What leaving autoannot on costs a training step, counted in CPU instructions (valgrind's
callgrind): exact and repeatable where this 2-core machine's step times move by 2-5% between
runs of one mode.

    python benchmarks/step_instructions.py [--model ddp|fsdp2] [--steps N] [-o OUT.json]

Rank 0 of a gloo group of 2 ranks, counted (rank 1 runs beside it, uncounted; the steps a
mode are the same on both); DDP also on 1 rank (``--world 1``: its collectives run gloo's code
and move nothing). Instructions count the work done, not the waiting: the agent's share of a
rank's instructions is an upper bound of its share of a real step's time, which also waits.
FSDP2 needs 2 ranks (on 1 it launches no collective). The model of
``production.py`` (6 x Linear(256), batch 32 by default; ``--width``, ``--batch``): DDP (small
buckets: several all-reduces a step; ``--bucket-mb``) or FSDP2 (``fully_shard`` a layer a
unit). Modes, each N steps between callgrind's start and
stop requests after a few untimed ones: the agent off; on and idle; with the ring
(``AUTOANNOT_RING``, opened before ``enable()`` as at start-up); with a record file. Prints a
table (instructions a step, x off) and one line of JSON. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import instructions

MODES = ("agent off", "agent on, idle", "ring", "record file")


def child(folder: str, model_kind: str, steps: int, rank: int, world: int,
          size: tuple[int, int, float] = (256, 32, 0.25)) -> None:
    import ctypes

    import torch
    import torch.distributed as dist

    import autoannot
    from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT
    from autoannot.keep.journal import Journal
    from autoannot.keep.ring import Ring

    helper = ctypes.CDLL(os.path.join(folder, "counting.so"))
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(folder, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    from production import training_step

    width, batch, bucket_mb = size
    step = training_step(model_kind, world, width, batch, bucket_mb)

    kept = {}
    for mode in MODES:
        journal = None
        if mode == "ring":
            journal = Ring(os.path.join(folder, "rings"), 1 << 16)
        elif mode == "record file":
            journal = Journal(os.path.join(folder, f"rank{rank}.jsonl"))
        if journal is not None:
            AGENT.state.open_journal(journal)
        if mode != "agent off":
            autoannot.enable()
        for _ in range(5):
            step()
        dist.barrier()
        gc.collect()
        gc.disable()
        helper.counting_start()
        for _ in range(steps):
            step()
        helper.counting_stop(mode.encode())
        gc.enable()
        if mode == "ring":
            kept["ring_launches_a_step"] = journal.count / (steps + 5)
        if journal is not None:
            AGENT.state.close_journal(journal)
            journal.close()
        autoannot.disable()
    if rank == 0:
        Path(folder, "kept.json").write_text(json.dumps({**kept, "torch": torch.__version__,
                                                          "world": world}))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("ddp", "fsdp2"), default="ddp")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--world", type=int, choices=(1, 2), default=2)
    parser.add_argument("--width", type=int, default=256, help="the Linear layers' width (256)")
    parser.add_argument("--batch", type=int, default=32, help="rows a step (32)")
    parser.add_argument("--bucket-mb", type=float, default=0.25,
                        help="DDP's bucket_cap_mb (0.25: several all-reduces a step; DDP's "
                             "default is 25)")
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("-o", "--output", help="also write the JSON line here (a new file)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.model, args.steps, args.rank, args.world,
              (args.width, args.batch, args.bucket_mb))
        return 0
    missing = instructions._missing()
    if missing:
        print(f"step_instructions.py: cannot count here: no {missing}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="autoannot-steps-") as folder:
        source = Path(folder, "counting.c")
        source.write_text(instructions.HELPER)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(Path(folder, "counting.so")),
                        str(source)], check=True)
        print(f"counting {args.steps} {args.model} steps a mode under callgrind ...",
              file=sys.stderr)
        rank_args = [__file__, "--child", folder, "--model", args.model, "--steps",
                     str(args.steps), "--world", str(args.world), "--width", str(args.width),
                     "--batch", str(args.batch), "--bucket-mb", str(args.bucket_mb)]
        rank_args[0] = os.environ.get("STEP_SCRIPT", rank_args[0])
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        beside = ([subprocess.Popen([sys.executable, *rank_args, "--rank", "1"], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
                  if args.world == 2 else [])
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                   f"--callgrind-out-file={folder}/callgrind.out.%p", sys.executable,
                   *rank_args, "--rank", "0"]
        ran = subprocess.run(command, env=env, capture_output=True, text=True)
        for other in beside:
            other.wait(timeout=600)
        if ran.returncode != 0:
            print(ran.stderr[-3000:], file=sys.stderr)
            return 1
        totals = instructions._totals(folder)
        kept = json.loads(Path(folder, "kept.json").read_text())
    per_step = {m: totals[m] / args.steps for m in MODES}
    base = per_step["agent off"]
    print(f"{args.model.upper()} step (6 x Linear({args.width}), batch {args.batch}), rank 0 "
          f"of a {args.world}-rank gloo group, torch {kept['torch']}: instructions")
    for mode in MODES:
        print(f"{mode:16} {per_step[mode]:14,.0f} {per_step[mode] / base:7.4f}")
    print(f"ring: {kept['ring_launches_a_step']:.1f} launches a step kept")
    result = {"model": args.model, "steps": args.steps, "width": args.width,
              "batch": args.batch, "bucket_mb": args.bucket_mb, **kept,
              "instructions_a_step": {m: round(v) for m, v in per_step.items()},
              "ratios": {m: round(v / base, 4) for m, v in per_step.items()}}
    line = json.dumps(result)
    print(line)
    if args.output:
        with open(args.output, "x") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

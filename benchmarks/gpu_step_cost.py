"""What timing each eager collective on the GPU costs an eager step, and which way of timing
costs least: one rank, a 1-rank NCCL group, on the device.

    PYTHONPATH=. python benchmarks/gpu_step_cost.py [OUT.json]

The step is training's shape, GPU-bound: ``LAYERS`` bf16 matmuls of ``SIZE`` x ``SIZE``, each
followed by an all-reduce of its output (``KIND=matmul``). Such matmuls hold the H100 at its
power limit, where its clock moves by some percent from one sample to the next: ``KIND=sleep``
runs the same step with a spinning kernel of the same time in place of each matmul
(``torch.cuda._sleep``, the clock steady), where what timing adds per collective shows in
microseconds. ``KIND=sleep,matmul`` runs both, one after the other. Variants, each a sample
of ``STEPS`` steps (GPU time between two events around them, on the GPU; the host's wall time
beside it), alternated ``ROUNDS`` times in one process, each round in a rotated order
(reversed every other round):

- ``ring``: the agent on, its ring open, no GPU times (the base every ratio is against);
- hand-made ops around each all-reduce, on the ring's step (what each costs the GPU alone):
  ``+1 timing event`` (recorded on the stream before), ``+2 timing events`` (before and
  after), ``+1 plain event`` (no timing), ``+branch timing event`` (a plain event on the
  stream, a stream of ours waiting on it, a timing event there), ``+2 branch timing events``,
  ``+branch stamp`` (the same branch, a stamp kernel there: ``keep/gpu_stamps.py``);
- the agent's GPU times as they ship, and with its knobs: ``GPU times`` (events on the stream,
  start and end), ``GPU times, start only``, ``GPU times, branched`` (``EAGER_BRANCHED``),
  ``GPU times, branched, start only``, ``GPU times, clock looks every 0.5 s`` (the clock's
  thread kept out of the way: what its looks cost), ``GPU stamps`` (``EAGER_STAMPS``),
  ``GPU times, driver's events`` (``DriverEvents``: the driver's events through ctypes, not
  torch's).

Per variant: the median over rounds of the round's ratio to ``ring`` in the same round (paired:
the GPU's clock and heat drift between rounds, not within one), the ratios' quartiles, and the
median GPU ms a step. Then the host's time of a 1-rank all-reduce call, host-bound (us a call),
for the agent's variants. Prints a table and one line of JSON (also written to OUT.json).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import autoannot
from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT
from autoannot.keep import gpu_clock
from autoannot.keep.gpu_clock import CudaEvents, DriverEvents
from autoannot.keep.ring import Ring

LAYERS, SIZE = 4, 4096
STEPS = int(os.environ.get("STEPS", "20"))
ROUNDS = int(os.environ.get("ROUNDS", "60"))
CALL_ROUNDS = int(os.environ.get("CALL_ROUNDS", "8"))
HAND = ("+1 timing event", "+2 timing events", "+1 plain event", "+branch timing event",
        "+2 branch timing events", "+branch stamp")
AGENTS = {  # name: (EAGER_BRANCHED, EAGER_ENDS, LOOK_EVERY_S, EAGER_STAMPS, driver's events)
    "GPU times": (False, True, 0.001, False, False),
    "GPU times, start only": (False, False, 0.001, False, False),
    "GPU times, branched": (True, True, 0.001, False, False),
    "GPU times, branched, start only": (True, False, 0.001, False, False),
    "GPU times, clock looks every 0.5 s": (False, True, 0.5, False, False),
    "GPU stamps": (False, True, 0.001, True, False),
    "GPU times, driver's events": (False, True, 0.001, False, True),
}
VARIANTS = ("ring", *HAND, *AGENTS)
KINDS = os.environ.get("KIND", "sleep,matmul").split(",")
#: The sleep step's sleeps, in matmuls' lengths (``SLEEP_X``: 2 keeps a slow host's launches
#: off the GPU's path, where the agent's host us a collective would show as the GPU's).
SLEEP_X = float(os.environ.get("SLEEP_X", "1"))


def main() -> int:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_port()))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    autoannot.enable()
    folder = tempfile.mkdtemp(prefix="autoannot-step-cost-")
    w = [torch.randn(SIZE, SIZE, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    x = torch.randn(SIZE, SIZE, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(SIZE, SIZE, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        x @ w[0]
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(20):
        x @ w[0]
    end.record()
    end.synchronize()
    matmul_ms = begin.elapsed_time(end) / 20
    begin.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    cycles = int(1_000_000 * matmul_ms * SLEEP_X / begin.elapsed_time(end))  # (as long, x)
    kind = ["matmul"]
    timing = [torch.cuda.Event(enable_timing=True) for _ in range(256)]
    plain = torch.cuda.Event()
    side = torch.cuda.Stream()
    from autoannot.keep.gpu_stamps import Stamps

    stamps = Stamps(points=4, depth=64)
    point = stamps.new_point()
    used = [0]

    def timed() -> Any:
        used[0] = (used[0] + 1) % len(timing)
        return timing[used[0]]

    def hand(kind: str) -> Callable[[Any], None]:
        def around(stream: Any, after: bool) -> None:
            if (kind == "+1 timing event" and not after) or kind == "+2 timing events":
                timed().record(stream)
            elif kind == "+1 plain event" and not after:
                plain.record(stream)
            elif (kind == "+branch timing event" and not after) or \
                    kind == "+2 branch timing events":
                plain.record(stream)
                side.wait_event(plain)
                timed().record(side)
            elif kind == "+branch stamp" and not after:
                plain.record(stream)
                side.wait_event(plain)
                stamps.launch(point, side.cuda_stream)
        return around

    def step(around: Any) -> None:
        for layer in w:
            if kind[0] == "sleep":
                torch.cuda._sleep(cycles)
                y = out
            else:
                y = x @ layer
            if around is None:
                dist.all_reduce(y)
                continue
            stream = torch.cuda.current_stream(0)
            around(stream, False)
            dist.all_reduce(y)
            around(stream, True)

    def opened(name: str, tag: str) -> Ring:
        ring = Ring(f"{folder}/{tag}", 1 << 14)
        if name in AGENTS:
            branched, ends, look, eager_stamps, driver = AGENTS[name]
            gpu_clock.EAGER_BRANCHED, gpu_clock.EAGER_ENDS = branched, ends
            gpu_clock.LOOK_EVERY_S, gpu_clock.EAGER_STAMPS = look, eager_stamps
            ring.gpu_source = DriverEvents if driver else CudaEvents
        AGENT.state.open_journal(ring)
        return ring

    def closed(ring: Ring) -> None:
        AGENT.state.close_journal(ring)
        ring.close()
        gpu_clock.EAGER_BRANCHED, gpu_clock.EAGER_ENDS = False, True
        gpu_clock.LOOK_EVERY_S, gpu_clock.EAGER_STAMPS = 0.001, False

    results: dict[str, dict] = {}
    for step_kind in KINDS:
        kind[0] = step_kind
        gpu_ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
        wall_ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
        host_ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(3):  # (warm: cuBLAS's choice, the allocator's blocks, the GPU's clock)
            step(None)
        started_all = time.monotonic()
        for r in range(ROUNDS):
            order = list(VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)])
            for name in (order if r % 2 == 0 else order[::-1]):
                ring = opened(name, f"{step_kind}{r}_{VARIANTS.index(name)}")
                around = hand(name) if name in HAND else None
                step(around)  # (one step first: the clock's thread started, the pools filled)
                torch.cuda.synchronize()
                begin.record()
                wall = time.perf_counter()
                for _ in range(STEPS):
                    step(around)
                host = time.perf_counter() - wall
                end.record()
                end.synchronize()
                wall = time.perf_counter() - wall
                gpu_ms[name].append(begin.elapsed_time(end) / STEPS)
                wall_ms[name].append(wall * 1e3 / STEPS)
                host_ms[name].append(host * 1e3 / STEPS)
                closed(ring)
            if r % 10 == 9:
                print(f"round {r + 1} of {ROUNDS}: {time.monotonic() - started_all:.0f} s",
                      file=sys.stderr, flush=True)
        results[step_kind] = {"gpu_ms": gpu_ms, "wall_ms": wall_ms, "host_ms": host_ms}
    # a 1-rank all-reduce's host time a call, host-bound (a small tensor)
    t = torch.ones(1 << 10, device="cuda")
    call_us: dict[str, list[float]] = {v: [] for v in ("ring", *AGENTS)}
    for r in range(CALL_ROUNDS):
        for name in (list(call_us) if r % 2 == 0 else list(call_us)[::-1]):
            ring = opened(name, f"c{r}_{VARIANTS.index(name)}")
            for _ in range(50):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            began = time.perf_counter()
            for _ in range(1000):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            call_us[name].append((time.perf_counter() - began) * 1e3)
            closed(ring)
    result = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
              "layers": LAYERS, "size": SIZE, "steps": STEPS, "rounds": ROUNDS,
              "matmul_ms": round(matmul_ms, 4), "sleep_cycles": cycles, "sleep_x": SLEEP_X,
              "kinds": {}}
    for step_kind, samples in results.items():
        rows = summary(samples["gpu_ms"], samples["wall_ms"], samples["host_ms"],
                       call_us if step_kind == KINDS[0] else {})
        result["kinds"][step_kind] = rows
        what = "bf16 matmul" if step_kind == "matmul" else f"sleep of {cycles} cycles"
        print(f"eager step ({step_kind}): {LAYERS} x ({what}, {matmul_ms:.3f} ms, + all-reduce "
              f"of {SIZE}^2 bf16), one rank; {ROUNDS} rounds x {STEPS} steps; ratio = median "
              "over rounds of the round's GPU ms a step / ring's; us a collective = (GPU ms a "
              f"step - ring's) / {LAYERS}, medians")
        print(f"{'variant':36} {'GPU ms':>8} {'ratio':>7} {'q1':>7} {'q3':>7} {'us/coll':>8} "
              f"{'host ms':>8} {'call us':>8}")
        for name, row in rows.items():
            print(f"{name:36} {row['gpu_ms']:8.4f} {row['ratio']:7.4f} {row['ratio_q1']:7.4f} "
                  f"{row['ratio_q3']:7.4f} {row['us_a_collective']:8.2f} {row['host_ms']:8.4f} "
                  f"{row.get('call_us', float('nan')):8.2f}")
    print(json.dumps(result))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "x") as f:
            json.dump({**result, "samples": {**results, "call_us": call_us}}, f)
    dist.destroy_process_group()
    return 0


def summary(gpu_ms: dict, wall_ms: dict, host_ms: dict, call_us: dict) -> dict:
    """Per variant: median GPU ms a step, the paired ratios' median and quartiles (against
    ``ring`` in the same round), the GPU us a collective added (paired, median), the wall and
    host ms, the host us a call."""
    rows: dict[str, dict] = {}
    for name, samples in gpu_ms.items():
        base = gpu_ms["ring"]
        ratios = sorted(s / b for s, b in zip(samples, base, strict=True))
        added = [(s - b) * 1e3 / LAYERS for s, b in zip(samples, base, strict=True)]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        rows[name] = {"gpu_ms": round(statistics.median(samples), 5),
                      "wall_ms": round(statistics.median(wall_ms[name]), 5),
                      "host_ms": round(statistics.median(host_ms[name]), 5),
                      "ratio": round(statistics.median(ratios), 4),
                      "ratio_q1": round(q[0], 4), "ratio_q3": round(q[2], 4),
                      "us_a_collective": round(statistics.median(added), 3)}
        if name in call_us:
            rows[name]["call_us"] = round(statistics.median(call_us[name]), 2)
    return rows


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())

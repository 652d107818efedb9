"""On 2 GPUs with NCCL: what the agent leaves in a process that captures CUDA graphs.

    PYTHONPATH=. python tests/gpu/footprint.py OUT_DIR

Per rank, in one process (the agent turned on and off by ``enable()``/``disable()``):

* idle cost after a capture, two other Python threads alive: ``pg.allreduce``, a
  ``_c10d_functional`` op and ``dist.all_reduce`` per call, agent off and agent on with nothing
  to annotate (after a graph was captured), medians of alternating rounds;
* ledgers over a long job: 1,000 capture/reset cycles of one graph and 300 graphs captured and
  freed: how many ledgers are kept, and that a live graph's is there;
* a function compiled (``torch.compile``) and run eagerly first, then captured whole in a
  ``torch.cuda.graph``: whether the capture works and how often it compiled.

Writes ``footprint_rank{r}.json``; prints rank 0's.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
import agent_hooks as hooks
from harness import launch_on_gpus

CALLS, ROUNDS = 500, 10


def per_call_us(call: Any) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / CALLS * 1e6


def capture_once(x: torch.Tensor) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        dist.all_reduce(x)  # warm-up on the side stream, as capture wants
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        dist.all_reduce(x)
    return graph


def idle_cost(rank: int) -> dict[str, Any]:
    import wrapt

    import autoannot

    ops = torch.ops._c10d_functional
    pg = dist.group.WORLD
    x = torch.ones(1024, device=f"cuda:{rank}")
    floor = wrapt.FunctionWrapper(dist.all_reduce, lambda f, i, a, k: f(*a, **k))
    calls = {
        "pg.allreduce": lambda: pg.allreduce([x]),
        "funcol op": lambda: ops.wait_tensor(ops.all_reduce(x, "sum", pg.group_name)),
        "dist.all_reduce": lambda: dist.all_reduce(x),
        "dist.all_reduce in a bare wrapt proxy": lambda: floor(x),
    }
    demand_seen = []
    stop = threading.Event()
    helpers = [threading.Thread(target=stop.wait) for _ in range(2)]
    for helper in helpers:
        helper.start()
    samples: dict[str, dict[str, list[float]]] = {n: {"off": [], "on": []} for n in calls}
    graphs = []  # each phase captures and replays a graph first (the process then differs
    # from one that never captured: NCCL, the caching allocator), so only the agent differs
    for round_ in range(ROUNDS):
        # off-on, then on-off: what comes first or second in a round weighs on both alike
        for mode in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
            if mode == "on":
                autoannot.enable()
            else:
                autoannot.disable()
            graphs.append(capture_once(x))  # agent on: the dispatcher layer held, released
            graphs[-1].replay()
            if mode == "on":
                demand_seen.append(hooks.AGENT.state.demand)
            for name, call in calls.items():
                samples[name][mode].append(per_call_us(call))
    stop.set()
    for helper in helpers:
        helper.join()
    autoannot.disable()
    result: dict[str, Any] = {"demand after the captures": demand_seen,
                              "wrapt proxy class": str(type(floor).__mro__[1])}
    for name, by_mode in samples.items():
        off, on = statistics.median(by_mode["off"]), statistics.median(by_mode["on"])
        result[name] = {"off_us": round(off, 2), "on_us": round(on, 2),
                        "ratio": round(on / off, 3)}
    return result


def ledgers_over_a_long_job(rank: int) -> dict[str, Any]:
    import gc

    import autoannot

    autoannot.enable()
    x = torch.ones(256, device=f"cuda:{rank}")
    start = len(hooks.LEDGERS)
    graph = capture_once(x)
    for _ in range(1000):
        graph.reset()
        with torch.cuda.graph(graph):
            dist.all_reduce(x)
    after_resets = len(hooks.LEDGERS) - start
    for _ in range(300):
        other = capture_once(x)
        other.replay()
        del other
    gc.collect()
    kept = len(hooks.LEDGERS) - start
    live = graph._autoannot_graph in hooks.LEDGERS and len(
        hooks.LEDGERS[graph._autoannot_graph].entries) == 1
    autoannot.disable()
    return {"captures": 1301, "ledgers kept after 1,000 resets": after_resets,
            "ledgers kept after 300 more graphs freed": kept, "live graph's ledger": live,
            "bound": hooks.LEDGERS.KEEP_RETIRED + 1}


def compiled_then_captured(rank: int) -> dict[str, Any]:
    """Agent off, then on: the same compiled function, warmed up eagerly, captured whole."""
    import autoannot

    result = {}
    for mode in ("off", "on"):
        compiles: list[int] = []

        def counting(gm: Any, example_inputs: Any, compiles: list[int] = compiles) -> Any:
            compiles.append(1)
            return gm.forward

        torch._dynamo.reset()
        if mode == "on":
            autoannot.enable()
        x = torch.ones(512, device=f"cuda:{rank}")

        @torch.compile(backend=counting)
        def step(t: torch.Tensor) -> torch.Tensor:
            return t * 2 + 1

        for _ in range(3):
            step(x)  # warm-up, eager, outside any capture
        graph = torch.cuda.CUDAGraph()
        outcome = "captured and replayed"
        try:
            with torch.cuda.graph(graph):
                y = step(x)
                dist.all_reduce(y)
            graph.replay()
            torch.cuda.synchronize()
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        autoannot.disable()
        result[mode] = {"outcome": outcome, "compiles": len(compiles)}
    return result


def worker(rank: int, world: int, out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    report = {"idle after a capture, 2 threads alive": idle_cost(rank),
              "ledgers": ledgers_over_a_long_job(rank),
              "compiled, then captured": compiled_then_captured(rank)}
    Path(out, f"footprint_rank{rank}.json").write_text(json.dumps(report, indent=1))
    if rank == 0:
        print(json.dumps(report, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(0 if launch_on_gpus(worker, 2, Path(sys.argv[1])) else 1)

"""On one GPU (a 1-rank NCCL group): where a captured Python-API launch's added time goes.

    PYTHONPATH=. python benchmarks/gpu_capture_parts.py [OUT.json] [--graphs]

One graph of 512 ``dist.all_reduce`` captured again and again, in alternating rounds:
agent off; agent off with the native observer registered for captures (torch's Work ranges
seen, their launches noted: what the observer alone costs); agent on (the proxies hand their
launches to the observer). Medians per capture, and per launch over agent off.

``--graphs``: where a set of graphs' added time goes instead — 8 graphs sharing a pool, each
empty, of 64 matmuls, of 64 all-reduces, or of both (the decoder's), agent off and on in
alternating rounds; then one set profiled (cProfile, the agent's own functions).
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
from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT

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

    import wrapt

    c10d = dist.distributed_c10d
    original = c10d.all_reduce
    floor = wrapt.FunctionWrapper(original, lambda wrapped, instance, args, kwargs:
                                  wrapped(*args, **kwargs))
    observer = AGENT.observer
    listen = observer.demand_changed if observer is not None else None

    def silent(state: object) -> None:  # the C wrappers key and note; no callback registered
        listen(state)
        module.set_demand(False, False, False)

    def mode(name: str) -> None:
        dist.all_reduce = c10d.all_reduce = original
        if observer is not None:
            AGENT.state.remove_listener(silent)
            AGENT.state.remove_listener(listen)
        if name in ("off", "observer alone", "wrapt floor"):
            autoannot.disable()
            if name == "observer alone":
                module.set_demand(True, False, False)
            if name == "wrapt floor":
                dist.all_reduce = c10d.all_reduce = floor
        else:
            autoannot.enable()
            if observer is not None:
                AGENT.state.add_listener(silent if name == "on, no callback" else listen)

    names = ["off", "on", "wrapt floor"] + (["observer alone", "on, no callback"]
                                            if module is not None else [])
    times: dict[str, list[float]] = {n: [] for n in names}
    quiet: dict[str, int] = {}
    for _ in range(ROUNDS):
        for name in names:
            mode(name)
            capture()  # warm-up after the switch
            before = module.quiet_calls() if module is not None else 0
            times[name].append(capture())
            if module is not None:
                quiet[name] = module.quiet_calls() - before
                module.set_demand(False, False, False)
    mode("off")
    medians = {n: statistics.median(v) for n, v in times.items()}
    result = {"launches": LAUNCHES, "capture_ms": medians,
              "added_us_per_launch": {n: round((medians[n] - medians["off"]) / LAUNCHES * 1e3, 2)
                                      for n in names},
              "native": module is not None,
              "launches_run_with_record_function_off": quiet}
    print(json.dumps(result))
    if out:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()
    return 0


def graphs(out: str | None) -> int:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29689")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    weight = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    bodies = {
        "empty": lambda: None,
        "64 matmuls": lambda: [x @ weight for _ in range(64)],
        "64 all-reduces": lambda: [dist.all_reduce(x) for _ in range(64)],
        "both": lambda: [dist.all_reduce(x @ weight) for _ in range(64)],
    }

    def capture_set(body: object) -> float:
        pool = torch.cuda.graph_pool_handle()
        made = []
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(8):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                body()  # type: ignore[operator]
            made.append(graph)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    for body in bodies.values():
        body()
    autoannot.enable()  # (the native observer is made at the first enable())
    observer = AGENT.observer
    module = observer.module if observer is not None else None

    def silent(state: object) -> None:  # the proxies' C wrappers note; no callback registered
        module.set_demand(False, False, False)

    modes = ("off", "on") + (("on, no callback",) if module is not None else ())
    times: dict[str, dict[str, list[float]]] = {n: {m: [] for m in modes} for n in bodies}
    for _ in range(ROUNDS):
        for mode in modes:
            (autoannot.disable if mode == "off" else autoannot.enable)()
            if mode == "on, no callback":
                AGENT.state.add_listener(silent)
            for name, body in bodies.items():
                capture_set(body)
                times[name][mode].append(capture_set(body))
            AGENT.state.remove_listener(silent)
    medians = {n: {m: round(statistics.median(v), 3) for m, v in per_mode.items()}
               for n, per_mode in times.items()}
    result = {"graphs": 8, "set_ms": medians,
              "added_us_per_graph": {n: {m: round((t - m_off["off"]) / 8 * 1e3, 1)
                                         for m, t in m_off.items() if m != "off"}
                                     for n, m_off in medians.items()}}
    print(json.dumps(result))
    import cProfile
    import pstats

    autoannot.enable()
    profiler = cProfile.Profile()
    profiler.enable()
    capture_set(bodies["both"])
    profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime")
    stats.print_stats(30)
    if out:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if not a.startswith("--")]
    run = graphs if "--graphs" in sys.argv else main
    sys.exit(run(arguments[0] if arguments else None))

"""On 2 GPUs: what the agent costs the graphs people capture, agent off against agent on.

    PYTHONPATH=. python benchmarks/gpu_capture.py [OUT.json]

(a) inference: a 32-layer tensor-parallel decoder stand-in (bf16, hidden 2048, two row-parallel
    matmuls a layer, each followed by an all-reduce: 64 all-reduces a graph), one graph per
    batch size for 8 batch sizes sharing a memory pool, captured largest first, as inference
    servers do; the whole set captured ROUNDS times.
(b) training: a whole DDP step (24 linear layers of 1024 x 1024, ``bucket_cap_mb=4``: 24
    buckets), PyTorch's recipe (DDP built in a side-stream context, 11 eager warm-up steps),
    captured ROUNDS times.

Each (workload, agent off/on) runs in its own processes (the agent on for the whole process,
as under AUTOANNOT=1), alternating off/on PROCESS_ROUNDS times. Per process: the first capture
(it pays for what is done once: the agent registers its dispatcher kernels there) and the
median of the later ones; replay time (CUDA events); an eager step with the agent idle. Prints
one JSON line of medians over the processes and writes it to OUT.json. A benchmark, not a test.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROUNDS, PROCESS_ROUNDS, REPLAYS, EAGER_STEPS = 3, 3, 20, 20
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
HIDDEN, LAYERS = 2048, 32


def _timed(fn: Any) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def _replay_us(replay: Any) -> float:
    import torch

    replay()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(REPLAYS):
        replay()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) * 1e3 / REPLAYS


def _eager_idle(step: Any) -> tuple[float, float | None]:
    """An eager step's time (ms, median); where the agent is on, also agent-off/agent-on
    alternated in this process (10 rounds of 3 steps): the ratio, free of the differences
    between processes (GPU clocks) that dominate a comparison across them."""
    import autoannot

    if not autoannot.is_enabled():
        return statistics.median(_timed(step) for _ in range(EAGER_STEPS)), None
    samples: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(10):
        for on in (False, True):
            (autoannot.enable if on else autoannot.disable)()
            samples[on] += [_timed(step) for _ in range(3)]
    autoannot.enable()
    on, off = statistics.median(samples[True]), statistics.median(samples[False])
    return on, on / off


def inference(rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.manual_seed(rank)
    weights = [(torch.randn(HIDDEN, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.01,
                torch.randn(HIDDEN, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.01)
               for _ in range(LAYERS)]

    @torch.no_grad()
    def forward(x: Any) -> Any:
        for attention, mlp in weights:
            x = x @ attention
            dist.all_reduce(x)
            x = x @ mlp
            dist.all_reduce(x)
        return x

    inputs = {b: torch.randn(b, HIDDEN, device="cuda", dtype=torch.bfloat16)
              for b in BATCH_SIZES}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for b in BATCH_SIZES:
            forward(inputs[b])
    torch.cuda.current_stream().wait_stream(side)
    eager, eager_ratio = _eager_idle(lambda: forward(inputs[8]))
    captures, graphs = [], {}
    for _ in range(ROUNDS):
        pool = torch.cuda.graph_pool_handle()
        graphs = {}

        def capture_all(pool: Any = pool, graphs: dict = graphs) -> None:
            for b in reversed(BATCH_SIZES):  # largest first
                graphs[b] = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graphs[b], pool=pool):
                    forward(inputs[b])

        dist.barrier()
        if os.environ.get("PROFILE_CAPTURE") and captures and rank == 0:  # where it goes
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.enable()
            captures.append(_timed(capture_all))
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
            continue
        captures.append(_timed(capture_all))
    replay = statistics.median(_replay_us(graphs[b].replay) for b in (1, 8, 128))
    return {"capture_ms": captures, "replay_us": replay, "eager_step_ms": eager,
            "eager_idle_in_process": eager_ratio, "collectives_per_graph": 2 * LAYERS}


def ddp_step(rank: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    layers = []
    for _ in range(24):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda()
    x = torch.randn(64, 1024, device="cuda") + rank
    y = torch.randn(64, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        net = DistributedDataParallel(model, device_ids=[rank], bucket_cap_mb=4)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.001)

        def step() -> None:
            F.mse_loss(net(x), y).backward()
            optimizer.step()

        for _ in range(11):
            optimizer.zero_grad(set_to_none=True)
            step()

        def fresh_step() -> None:
            optimizer.zero_grad(set_to_none=True)
            step()

        eager, eager_ratio = _eager_idle(fresh_step)
    torch.cuda.current_stream().wait_stream(side)
    captures, graph = [], None
    for _ in range(ROUNDS):
        graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)

        def capture(graph: Any = graph) -> None:
            with torch.cuda.graph(graph):
                step()

        captures.append(_timed(capture))
    replay = _replay_us(graph.replay)
    buckets = None
    import autoannot

    if autoannot.is_enabled():  # the gradient all-reduces of one eager step: DDP's buckets
        with torch.cuda.stream(side), autoannot.record(dispatcher=True) as records:
            fresh_step()
        torch.cuda.synchronize()
        buckets = sum(r.api == "c10d.allreduce_" for r in records)
    return {"capture_ms": captures, "replay_us": replay, "eager_step_ms": eager,
            "eager_idle_in_process": eager_ratio, "buckets": buckets}


WORKLOADS = {"inference": inference, "ddp": ddp_step}


def _worker(rank: int, world: int, port: int, workload: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    import autoannot

    if autoannot.is_enabled() != (os.environ.get("AUTOANNOT") == "1"):
        raise RuntimeError("the agent is not in the state this process was started for")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    result = WORKLOADS[workload](rank)
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.barrier()
    os._exit(0)  # NCCL teardown with live graphs can hang; the result is written


def run_one(workload: str, agent: bool) -> dict[str, Any]:
    """One process pair: ``workload`` with the agent on (for the whole process) or off."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        code = ("import sys; sys.argv = ['x']; "
                "import socket, torch.multiprocessing as mp; "
                "from benchmarks.gpu_capture import _worker; "
                "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; "
                f"s.close(); mp.spawn(_worker, args=(2, port, {workload!r}, {out.name!r}), "
                "nprocs=2)")
        env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
               "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
        env.pop("AUTOANNOT", None)
        if agent:  # every process, the spawned ranks too: the start-up hook, as AUTOANNOT=1 does
            hook = Path(__file__).resolve().parents[1] / "autoannot" / "_hook"
            env["AUTOANNOT"] = "1"
            env["PYTHONPATH"] = os.pathsep.join([str(hook), env.get("PYTHONPATH", "")])
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
        return json.loads(Path(out.name).read_text())


def main() -> int:
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        w: {"off": [], "on": []} for w in WORKLOADS}
    for _ in range(PROCESS_ROUNDS):
        for workload in WORKLOADS:
            for mode in ("off", "on"):
                print(f"{workload}, agent {mode} ...", file=sys.stderr, flush=True)
                results[workload][mode].append(run_one(workload, mode == "on"))
    summary: dict[str, Any] = {}
    for workload, modes in results.items():
        m: dict[str, dict[str, float]] = {}
        for mode, runs in modes.items():
            m[mode] = {
                "first_capture_ms": statistics.median(r["capture_ms"][0] for r in runs),
                "later_capture_ms": statistics.median(c for r in runs for c in r["capture_ms"][1:]),
                "replay_us": statistics.median(r["replay_us"] for r in runs),
                "eager_step_ms": statistics.median(r["eager_step_ms"] for r in runs),
            }
        summary[workload] = {
            **{f"{k}_{mode}": round(v, 3) for mode in m for k, v in m[mode].items()},
            "later_capture_on_over_off": round(m["on"]["later_capture_ms"]
                                               / m["off"]["later_capture_ms"], 3),
            "first_capture_on_over_off": round(m["on"]["first_capture_ms"]
                                               / m["off"]["first_capture_ms"], 3),
            "replay_on_over_off": round(m["on"]["replay_us"] / m["off"]["replay_us"], 3),
            "eager_idle_on_over_off_across_processes": round(m["on"]["eager_step_ms"]
                                                             / m["off"]["eager_step_ms"], 3),
            "eager_idle_on_over_off_in_process": round(statistics.median(
                r["eager_idle_in_process"] for r in modes["on"]), 3),
            "extra": {k: v for k, v in modes["on"][0].items()
                      if k not in ("capture_ms", "replay_us", "eager_step_ms",
                                   "eager_idle_in_process")},
        }
    line = json.dumps(summary)
    print(line)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps({"raw": results, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

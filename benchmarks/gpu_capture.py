"""On 2 GPUs: what the agent costs the graphs people capture, agent off against agent on.

    PYTHONPATH=. python benchmarks/gpu_capture.py [OUT.json]

(a) inference: a 32-layer tensor-parallel decoder stand-in (bf16, hidden 2048, two row-parallel
    matmuls a layer, each followed by an all-reduce: 64 all-reduces a graph), one graph per
    batch size for 8 batch sizes sharing a memory pool, captured largest first, as inference
    servers do; the whole set captured ROUNDS times.
(b) training: a whole DDP step (24 linear layers of 1024 x 1024, ``bucket_cap_mb=4``: 24
    buckets), PyTorch's recipe (DDP built in a side-stream context, 11 eager warm-up steps),
    captured ROUNDS times.

First captures: each (workload, agent off/on) runs in its own processes (the agent on for the
whole process, as under AUTOANNOT=1), alternating off/on PROCESS_ROUNDS times; each reports its
first capture (it pays for what is done once: the agent registers its dispatcher kernels
there).

Later captures, replays and eager steps are compared inside the agent-on processes, the agent
turned off and on (``disable()``/``enable()``) in alternating rounds: processes differ by more
than the agent costs (GPU clocks, allocator state: later captures of one workload ranged
36-57 ms across agent-off processes). Each round, per mode: one capture to warm up (with the
agent just turned on, it registers the dispatcher kernels again), then MEASURED captures; the
replay of the last graph (CUDA events); eager steps. Prints one JSON line of medians and
writes it, with every sample, to OUT.json. A benchmark, not a test.
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

ROUNDS, MEASURED, PROCESS_ROUNDS, REPLAYS, EAGER_STEPS = 20, 3, 2, 20, 3
ROUNDS = int(os.environ.get("ROUNDS", ROUNDS))
PROCESS_ROUNDS = int(os.environ.get("PROCESS_ROUNDS", PROCESS_ROUNDS))
#: Ranks (GPUs); ``WORLD=1``: one GPU, a 1-rank NCCL group (NCCL launches no kernel for most
#: of its collectives, torch's CPU path and the agent's run as on more).
WORLD = int(os.environ.get("WORLD", "2"))
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


class Workload:
    """What one workload gives the driver: ``capture()`` makes its graphs anew (returns a
    replay function), ``eager_step()`` runs one step without graphs."""

    capture: Any
    eager_step: Any
    extra: dict[str, Any]


def _round(workload: Workload, on: bool) -> dict[str, Any]:
    """One round in one mode: a warm-up capture, MEASURED timed ones, replays of the last
    graph, eager steps."""
    import autoannot

    (autoannot.enable if on else autoannot.disable)()
    if autoannot.is_enabled() != on:
        raise RuntimeError("the agent did not turn " + ("on" if on else "off"))
    replay = workload.capture()  # warm-up: with the agent just on, registers its kernels
    captures, made = [], []
    for _ in range(MEASURED):
        captures.append(_timed(lambda: made.append(workload.capture())))
        replay = made.pop()
    return {"capture_ms": captures, "replay_us": _replay_us(replay),
            "eager_step_ms": [_timed(workload.eager_step) for _ in range(EAGER_STEPS)]}


def _measure(rank: int, workload: Workload) -> dict[str, Any]:
    """The first capture; where the agent is on, alternating off/on rounds after it."""
    import torch.distributed as dist

    import autoannot

    dist.barrier()
    first = _timed(workload.capture)
    result: dict[str, Any] = {"first_capture_ms": first, **workload.extra}
    if not autoannot.is_enabled():
        return result
    if os.environ.get("PROFILE_CAPTURE") and rank == 0:  # where a later capture's time goes
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        workload.capture()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    rounds: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for _ in range(ROUNDS):
        for mode in ("off", "on"):
            dist.barrier()
            rounds[mode].append(_round(workload, mode == "on"))
    autoannot.enable()
    result["rounds"] = rounds
    return result


def inference(rank: int) -> Workload:
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

    def capture() -> Any:
        """Every batch size's graph, largest first, in one new pool."""
        pool = torch.cuda.graph_pool_handle()
        graphs = {}
        for b in reversed(BATCH_SIZES):
            graphs[b] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[b], pool=pool):
                forward(inputs[b])

        def replay() -> None:
            for b in (1, 8, 128):
                graphs[b].replay()

        return replay

    workload = Workload()
    workload.capture, workload.eager_step = capture, lambda: forward(inputs[8])
    workload.extra = {"collectives_per_graph": 2 * LAYERS, "graphs": len(BATCH_SIZES)}
    return workload


def ddp_step(rank: int) -> Workload:
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
        # DDP times every 100th iteration with CUDA events, which a capture cannot hold
        # ("CUDA error: invalid argument" in the 100th step when it is captured): not here.
        if hasattr(net, "_set_ddp_runtime_logging_sample_rate"):
            net._set_ddp_runtime_logging_sample_rate(2**31 - 1)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.001)

        def step() -> None:
            F.mse_loss(net(x), y).backward()
            optimizer.step()

        for _ in range(11):
            optimizer.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)

    def eager_step() -> None:
        with torch.cuda.stream(side):
            optimizer.zero_grad(set_to_none=True)
            step()
        torch.cuda.current_stream().wait_stream(side)

    def capture() -> Any:
        graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            step()
        return graph.replay

    buckets = None
    import autoannot

    if autoannot.is_enabled():  # the gradient all-reduces of one eager step: DDP's buckets
        with torch.cuda.stream(side), autoannot.record(dispatcher=True) as records:  # (any agent)
            optimizer.zero_grad(set_to_none=True)
            step()
        torch.cuda.synchronize()
        buckets = sum(r.api == "c10d.allreduce_" for r in records)
    workload = Workload()
    workload.capture, workload.eager_step = capture, eager_step
    workload.extra = {"buckets": buckets}
    return workload


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
    result = _measure(rank, WORKLOADS[workload](rank))
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
                f"s.close(); mp.spawn(_worker, args=({WORLD}, port, {workload!r}, "
                f"{out.name!r}), nprocs={WORLD})")
        env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
               "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
        env.pop("AUTOANNOT", None)
        if agent:  # every process, the spawned ranks too: the start-up hook, as AUTOANNOT=1 does
            hook = Path(__file__).resolve().parents[1] / "autoannot" / "_hook"
            env["AUTOANNOT"] = "1"
            env["PYTHONPATH"] = os.pathsep.join([str(hook), env.get("PYTHONPATH", "")])
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
        return json.loads(Path(out.name).read_text())


def _median_of_rounds(rounds: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rounds]
    flat = [v for value in values for v in (value if isinstance(value, list) else [value])]
    return statistics.median(flat)


def summarize(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Medians: first captures across processes; the rest from the alternating rounds."""
    summary: dict[str, Any] = {}
    for workload, modes in results.items():
        first = {mode: statistics.median(r["first_capture_ms"] for r in runs)
                 for mode, runs in modes.items()}
        rounds = {mode: [r for run in modes["on"] for r in run["rounds"][mode]]
                  for mode in ("off", "on")}
        m = {mode: {key: _median_of_rounds(rounds[mode], key)
                    for key in ("capture_ms", "replay_us", "eager_step_ms")}
             for mode in ("off", "on")}
        # per round, on over off (the pairs share the machine's state of the moment)
        per_round = [statistics.median(on["capture_ms"]) / statistics.median(off["capture_ms"])
                     for on, off in zip(rounds["on"], rounds["off"], strict=True)]
        summary[workload] = {
            "first_capture_ms_off": round(first["off"], 3),
            "first_capture_ms_on": round(first["on"], 3),
            "first_capture_on_over_off": round(first["on"] / first["off"], 3),
            **{f"later_{k}_{mode}": round(v, 3) for mode in m for k, v in m[mode].items()},
            "later_capture_on_over_off": round(m["on"]["capture_ms"] / m["off"]["capture_ms"], 3),
            "later_capture_on_over_off_per_round": [round(r, 3) for r in per_round],
            "replay_on_over_off": round(m["on"]["replay_us"] / m["off"]["replay_us"], 3),
            "eager_idle_on_over_off": round(m["on"]["eager_step_ms"]
                                            / m["off"]["eager_step_ms"], 3),
            "extra": {k: v for k, v in modes["on"][0].items()
                      if k not in ("first_capture_ms", "rounds")},
        }
    return summary


def main() -> int:
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        w: {"off": [], "on": []} for w in WORKLOADS}
    only = os.environ.get("WORKLOADS", ",".join(WORKLOADS)).split(",")
    for _ in range(PROCESS_ROUNDS):
        for workload in only:
            for mode in ("off", "on"):
                print(f"{workload}, agent {mode} ...", file=sys.stderr, flush=True)
                results[workload][mode].append(run_one(workload, mode == "on"))
    summary = summarize({w: results[w] for w in only})
    line = json.dumps(summary)
    print(line)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps({"raw": results, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

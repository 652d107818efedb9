"""On 2 GPUs (``WORLD=1``: one, a 1-rank group): what the agent costs a CUDA graph of 100
collectives — capture and replay.

    PYTHONPATH=. python benchmarks/gpu_graph.py [OUT.json]

Each rank captures the same body (100 small all_reduces over two process groups) with the
agent off and on, alternately, ROUNDS times; each time the agent is turned off or on, one
capture warms up (with the agent just on, it registers the dispatcher kernels again: a job
does that once), then one is timed (wall clock, synchronized), then REPLAYS replays of it
(CUDA events), with no profiler running. The first capture with the agent on is also reported
alone (kernels registered, cold caches). First captures of a process, agent off and on, are
measured in processes of their own (``gpu_first_capture.py``: one GPU, a 1-rank group, 100
all-reduces), alternating FIRST_ROUNDS times, before the ranks start.
``GRAPH_RING=FOLDER``: "agent on" keeps the always-on ring too (its captures write it; a
replay launches no Python collective). Prints a table and a final JSON line (rank 0's
medians); writes the JSON to OUT.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

import autoannot
from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT
from autoannot.keep.ring import Ring

COLLECTIVES, ROUNDS, REPLAYS = 100, 7, 200
#: ``GRAPH_RING=FOLDER``: "agent on" also keeps the ring (``AUTOANNOT_RING``) there.
RING_DIR = os.environ.get("GRAPH_RING", "")
FIRST_ROUNDS = int(os.environ.get("FIRST_ROUNDS", "3"))


def first_captures(rounds: int) -> dict[str, float]:
    """Medians of a process's first capture, agent off and on, each in its own process."""
    import socket
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    taken: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for mode in ("off", "on"):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            done = subprocess.run([sys.executable, os.path.join(here, "gpu_first_capture.py"),
                                   mode], env={**os.environ, "PORT": str(port)},
                                  capture_output=True, text=True, check=True)
            taken[mode].append(json.loads(done.stdout.strip().splitlines()[-1])
                               ["first_capture_ms"])
    off, on = statistics.median(taken["off"]), statistics.median(taken["on"])
    return {"first_capture_ms_off": round(off, 3), "first_capture_ms_on": round(on, 3),
            "first_capture_added_ms": round(on - off, 3), "first_capture_samples": taken}


def worker(rank: int, world: int, port: int, out_path: str | None,
           first: dict[str, Any]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    groups = [dist.group.WORLD, dist.new_group(list(range(world)), group_desc="tp")]
    tensors = [torch.ones(1024, device="cuda") for _ in range(COLLECTIVES)]

    def body() -> None:
        for i, t in enumerate(tensors):
            dist.all_reduce(t, group=groups[i % 2])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    samples: dict[str, dict[str, list[float]]] = {m: {"capture_ms": [], "replay_us": []}
                                                   for m in ("agent off", "agent on")}
    first_on: list[float] = []
    ring = None
    for _ in range(ROUNDS):
        for mode in ("agent off", "agent on"):
            if mode == "agent on":
                if RING_DIR:  # (opened before enable(), as AUTOANNOT_RING opens it)
                    ring = Ring(f"{RING_DIR}/run", 1 << 16)
                    AGENT.state.open_journal(ring)
                autoannot.enable()
            else:
                autoannot.disable()
                if ring is not None:
                    AGENT.state.close_journal(ring)
                    ring.close()
                    ring = None
            for warm_up in (True, False):  # the first capture after enable() registers kernels
                graph = torch.cuda.CUDAGraph()
                torch.cuda.synchronize()
                dist.barrier()
                start = time.perf_counter()
                with torch.cuda.graph(graph):
                    body()
                torch.cuda.synchronize()
                took = (time.perf_counter() - start) * 1e3
                if not warm_up:
                    samples[mode]["capture_ms"].append(took)
                elif mode == "agent on" and not first_on:
                    first_on.append(took)
            graph.replay()
            torch.cuda.synchronize()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(REPLAYS):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            samples[mode]["replay_us"].append(begin.elapsed_time(end) * 1e3 / REPLAYS)
            del graph
    # Replays while torch's profiler records (CPU and CUDA activities): the marker's cost.
    profiled: dict[str, list[float]] = {"agent off": [], "agent on": []}
    markers: dict[str, int] = {}
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    for _ in range(3):
        for mode in ("agent off", "agent on"):
            (autoannot.enable if mode == "agent on" else autoannot.disable)()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                body()
            graph.replay()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=activities) as prof:
                begin = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(REPLAYS // 4):
                    graph.replay()
                end.record()
                torch.cuda.synchronize()
            profiled[mode].append(begin.elapsed_time(end) * 1e3 / (REPLAYS // 4))
            markers[mode] = sum(1 for e in prof.events() if e.name.startswith("autoannot.replay:"))
            del graph
    autoannot.disable()
    if rank == 0 and os.environ.get("PROFILE_CAPTURE"):  # where a capture's added time goes
        import cProfile
        import pstats

        autoannot.enable()
        graph = torch.cuda.CUDAGraph()
        profiler = cProfile.Profile()
        profiler.enable()
        with torch.cuda.graph(graph):
            body()
        profiler.disable()
        torch.cuda.synchronize()
        autoannot.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        del graph
    if rank == 0:
        medians = {mode: {k: statistics.median(v) for k, v in values.items()}
                   for mode, values in samples.items()}
        print(f"{'':10} {'capture (ms)':>13} {'replay (us)':>12}   median of {ROUNDS}, "
              f"{COLLECTIVES} all_reduces, {REPLAYS} replays timed")
        for mode, m in medians.items():
            print(f"{mode:10} {m['capture_ms']:13.2f} {m['replay_us']:12.2f}")
        summary = {
            "torch": torch.__version__, "gpus": torch.cuda.get_device_name(0),
            "collectives": COLLECTIVES,
            "capture_ms_off": round(medians["agent off"]["capture_ms"], 3),
            "capture_ms_on": round(medians["agent on"]["capture_ms"], 3),
            "capture_ms_on_first": round(first_on[0], 3),
            "capture_on_over_off": round(medians["agent on"]["capture_ms"]
                                         / medians["agent off"]["capture_ms"], 3),
            "replay_us_off": round(medians["agent off"]["replay_us"], 2),
            "replay_us_on": round(medians["agent on"]["replay_us"], 2),
            "replay_on_over_off": round(medians["agent on"]["replay_us"]
                                        / medians["agent off"]["replay_us"], 3),
            "replay_us_off_profiled": round(statistics.median(profiled["agent off"]), 2),
            "replay_us_on_profiled": round(statistics.median(profiled["agent on"]), 2),
            "replay_markers_profiled": {"replays": REPLAYS // 4, **markers},
            **first,
            "samples": samples,
        }
        print(json.dumps({k: v for k, v in summary.items()
                          if k not in ("samples", "first_capture_samples")}))
        if out_path:
            with open(out_path, "w") as f:
                json.dump(summary, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    import socket

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out_path = sys.argv[1] if len(sys.argv) > 1 else None
    world = int(os.environ.get("WORLD", min(2, torch.cuda.device_count())))  # 1: one GPU
    first = first_captures(FIRST_ROUNDS) if FIRST_ROUNDS > 0 else {}
    torch.multiprocessing.spawn(worker, args=(world, port, out_path, first), nprocs=world)
    return 0


if __name__ == "__main__":
    sys.exit(main())

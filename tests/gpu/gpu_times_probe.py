"""Issue 65's first step on one GPU: can the GPU's own times of each collective be had, on the
host's monotonic clock, without blocking the launching thread or syncing the device — eager
(two processes sharing the GPU over gloo with CUDA tensors) and in a captured graph's replay
(a 1-rank NCCL group)? Plants a known GPU delay (``torch.cuda._sleep``) and says what the
host's times and the GPU's show. A probe, not the feature: its JSON goes to tests/data/gpu/.

    python tests/gpu/gpu_times_probe.py OUT.json [--steps 30] [--plant-ms 20]

The mechanism probed: ``torch.cuda.Event(enable_timing=True)`` recorded on the collective's
stream just before and after it (in a graph: ``external=True``, captured as event-record nodes
and recorded again at each replay), read from another thread by ``query()`` and
``elapsed_time`` against a reference event whose host time is known (recorded, synchronized
once at start: the conversion's error is that one sync's latency, measured and said).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gpu_times import cycles_for  # (beside it: run as a script, its folder is on the path)


def reference() -> tuple[torch.cuda.Event, int, float]:
    """An event whose host time is known: (event, its host monotonic ns, the sync's latency in
    us, bounding the conversion's error)."""
    torch.cuda.synchronize()
    event = torch.cuda.Event(enable_timing=True)
    before = time.monotonic_ns()
    event.record()
    event.synchronize()
    after = time.monotonic_ns()
    return event, after, (after - before) / 1e3


def host_ns(ref: tuple[torch.cuda.Event, int, float], event: torch.cuda.Event) -> int:
    """``event``'s GPU time on the host's monotonic clock (it has completed)."""
    return ref[1] + int(ref[0].elapsed_time(event) * 1e6)


def eager_rank(rank: int, world: int, port: int, steps: int, plant_ms: float, out: str) -> None:
    """Two ranks on one GPU, gloo with CUDA tensors; rank 1's GPU late by ``plant_ms`` before
    each all-reduce, its host on time. Each rank's host entry and its GPU start and end."""
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    cycles = cycles_for(plant_ms)
    tensor = torch.ones(1 << 16, device="cuda")
    ref = reference()
    rows, cost = [], []
    read: list[tuple[int, int]] = []

    def reader(pending: list[tuple[torch.cuda.Event, torch.cuda.Event]]) -> None:
        """Another thread: each collective's events, once done, on the host's clock (no
        device sync: ``query`` until complete)."""
        while len(read) < steps:
            if len(pending) <= len(read):
                time.sleep(0.0002)
                continue
            start, end = pending[len(read)]
            while not end.query():
                time.sleep(0.0002)
            read.append((host_ns(ref, start), host_ns(ref, end)))

    pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    thread = threading.Thread(target=reader, args=(pending,))
    for step in range(steps):
        dist.barrier()
        if rank == 1:
            torch.cuda._sleep(cycles)  # (the GPU late; the host goes on at once)
        entered = time.monotonic_ns()
        t0 = time.perf_counter_ns()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t1 = time.perf_counter_ns()
        work = dist.all_reduce(tensor, async_op=True)
        t2 = time.perf_counter_ns()
        work.wait()  # (gloo: the current stream waits on its stream)
        end.record()
        t3 = time.perf_counter_ns()
        cost.append(((t1 - t0) + (t3 - t2)) / 1e3)
        pending.append((start, end))
        rows.append({"step": step, "host_entered_ns": entered})
        if step == 0:
            thread.start()
    thread.join()
    for row, (gpu_start, gpu_end) in zip(rows, read, strict=True):
        row["gpu_start_ns"], row["gpu_end_ns"] = gpu_start, gpu_end
    torch.cuda.synchronize()
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump({"rank": rank, "rows": rows, "sync_latency_us": ref[2],
                   "event_host_cost_us": statistics.median(cost), "plant_cycles": cycles}, f)
    dist.destroy_process_group()


def eager(steps: int, plant_ms: float, out: str) -> dict:
    port = 29500 + os.getpid() % 1000
    mp.spawn(eager_rank, args=(2, port, steps, plant_ms, out), nprocs=2, join=True)
    ranks = []
    for rank in range(2):
        with open(f"{out}.rank{rank}") as f:
            ranks.append(json.load(f))
        os.unlink(f"{out}.rank{rank}")
    skip = 3  # (the first steps: warm-up)
    host = [(b["host_entered_ns"] - a["host_entered_ns"]) / 1e6
            for a, b in zip(ranks[0]["rows"][skip:], ranks[1]["rows"][skip:], strict=True)]
    gpu = [(b["gpu_start_ns"] - a["gpu_start_ns"]) / 1e6
           for a, b in zip(ranks[0]["rows"][skip:], ranks[1]["rows"][skip:], strict=True)]
    return {"plant_ms": plant_ms, "steps": steps - skip,
            "host_entry_skew_ms_rank1_minus_rank0": _spread(host),
            "gpu_start_skew_ms_rank1_minus_rank0": _spread(gpu),
            "sync_latency_us": [r["sync_latency_us"] for r in ranks],
            "event_host_cost_us_median": [r["event_host_cost_us"] for r in ranks]}


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3)}


def graph(plant_ms: float, replays: int, out: str) -> dict:
    """A 1-rank NCCL group; a graph of 8 all-reduces, a timing event captured before and after
    each (``external=True``), ``plant_ms`` of GPU sleep before the 5th. Each replay's GPU
    starts, from the events, on the host's clock; then a replay held in a long sleep before its
    5th, watched from another thread: the first start event not reached names the collective
    the GPU sits before."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29800 + os.getpid() % 100))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    cycles = cycles_for(plant_ms)
    tensors = [torch.ones(1 << 14, device="cuda") for _ in range(8)]
    stream = torch.cuda.Stream()

    def made(sleep: int) -> tuple[torch.cuda.CUDAGraph, list[tuple[torch.cuda.Event, ...]]]:
        events = [(torch.cuda.Event(enable_timing=True, external=True),
                   torch.cuda.Event(enable_timing=True, external=True)) for _ in tensors]
        g = torch.cuda.CUDAGraph()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for t in tensors:  # (warm-up, outside the capture)
                dist.all_reduce(t)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for i, t in enumerate(tensors):
                if i == 4 and sleep:
                    torch.cuda._sleep(sleep)
                events[i][0].record()
                dist.all_reduce(t)
                events[i][1].record()
        return g, events

    g, events = made(cycles)
    ref = reference()
    starts = []
    replay_cost = []
    for _ in range(replays):
        t0 = time.perf_counter_ns()
        g.replay()
        replay_cost.append((time.perf_counter_ns() - t0) / 1e3)
        events[-1][1].synchronize()
        at = [host_ns(ref, s) for s, _ in events]
        starts.append([(a - at[0]) / 1e6 for a in at])
    fifth = [s[4] - s[3] for s in starts[1:]]
    # Re-armed at launch? A replay queued behind 300 ms of sleep: its events read "not done".
    torch.cuda._sleep(cycles_for(300))
    g.replay()
    rearmed = {"first_start_done_right_after_launch": events[0][0].query(),
               "last_end_done_right_after_launch": events[-1][1].query()}
    try:
        ref[0].elapsed_time(events[0][0])
        rearmed["elapsed_time_while_pending"] = "read"
    except RuntimeError as error:
        rearmed["elapsed_time_while_pending"] = str(error).splitlines()[0][:120]
    torch.cuda.synchronize()
    # The events' GPU cost in a replay: the same 8 all-reduces with and without them.
    plain = torch.cuda.CUDAGraph()
    with torch.cuda.graph(plain):
        for t in tensors:
            dist.all_reduce(t)
    timed, _ = made(0)
    gpu_us: dict[str, list[float]] = {"plain": [], "timed": []}
    host_us: dict[str, list[float]] = {"plain": [], "timed": []}
    for _ in range(200):
        for name, which in (("plain", plain), ("timed", timed)):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            t0 = time.perf_counter_ns()
            which.replay()
            host_us[name].append((time.perf_counter_ns() - t0) / 1e3)
            b.record()
            b.synchronize()
            gpu_us[name].append(a.elapsed_time(b) * 1e3)
    cost = {name: {"gpu_us_median": round(statistics.median(gpu_us[name]), 2),
                   "host_us_median": round(statistics.median(host_us[name]), 2)}
            for name in gpu_us}
    # A replay held before its 5th collective: watched from another thread, no device sync.
    held_cycles = cycles_for(3000)
    held, held_events = made(held_cycles)
    seen: dict = {}

    def watcher(replayed_ns: list[int]) -> None:
        time.sleep(1.0)
        reached = [s.query() for s, _ in held_events]
        first_not = reached.index(False) if False in reached else None
        seen.update({"collective_index_not_started": first_not,
                     "reached": reached, "watched_after_s": round(
                         (time.monotonic_ns() - replayed_ns[0]) / 1e9, 3)})

    replayed_ns: list[int] = []
    thread = threading.Thread(target=watcher, args=(replayed_ns,))
    replayed_ns.append(time.monotonic_ns())
    thread.start()
    held.replay()
    thread.join()
    torch.cuda.synchronize()
    dist.destroy_process_group()
    return {"plant_ms": plant_ms, "replays": replays,
            "fifth_start_after_fourth_ms": _spread(fifth),
            "starts_ms_of_one_replay": [round(x, 3) for x in starts[-1]],
            "replay_host_call_us_median": statistics.median(replay_cost),
            "rearmed": rearmed, "replay_cost_8_collectives_16_events": cost,
            "held_replay": seen}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--plant-ms", type=float, default=20.0)
    parser.add_argument("--replays", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_times_probe.py: no CUDA device", file=sys.stderr)
        return 2
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
              "eager_gloo_cuda": eager(args.steps, args.plant_ms, args.out),
              "graph_nccl_1rank": graph(args.plant_ms, args.replays, args.out)}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the ways of timing a collective on the GPU cost, eager and in a graph's replays back to
back (a probe for issue 65). One rank, a 1-rank NCCL group; a step of 8 x (a matmul, an
all-reduce of ``1 << 14`` floats) so the GPU, not the host, is what the loop waits for. Ways:
- ``plain``: nothing added;
- ``events``: a timing event recorded before and after each all-reduce on its stream (in a
  capture: ``external=True``, event-record nodes);
- ``events, branched``: the same events recorded on a side stream that waits for the main one
  (in a graph: a branch that nothing waits for until the graph's end);
- ``stamps`` / ``stamps, branched``: a one-thread kernel (PTX, loaded through the driver's JIT:
  ``autoannot.keep.gpu_stamps``) that writes the GPU's ``%globaltimer`` into pinned host memory,
  one slot a run of it (its own counter): each replay's time its own.
Each way's host time a call (eager: a step; graphs: a replay call, back to back) and the GPU's
time, alternated over rounds; whether a captured event reads "not done" right after its graph
is launched again; the stamps' replay-by-replay times against a planted sleep; what the clock
thread's calls cost the host.

    PYTHONPATH=. python tests/gpu/graph_event_cost.py OUT.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

REPLAYS, ROUNDS, STEPS = 100, 5, 50


def main() -> int:
    from autoannot.keep.gpu_stamps import Stamps

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29700 + os.getpid() % 200))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    tensors = [torch.ones(1 << 14, device="cuda") for _ in range(8)]
    a = torch.randn(1536, 1536, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for t in tensors:
            dist.all_reduce(t)
        _ = a @ a
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    branch = torch.cuda.Stream()
    stamps = Stamps(points=4096, depth=64)

    def step(way: str, keep: list, plant: int = 0) -> None:
        capturing = torch.cuda.is_current_stream_capturing()
        for i, t in enumerate(tensors):
            _ = a @ a
            if i == 4 and plant:
                torch.cuda._sleep(plant)
            mark(way, keep, capturing)
            dist.all_reduce(t)
            mark(way, keep, capturing)

    def mark(way: str, keep: list, capturing: bool) -> None:
        if way == "plain":
            return
        here = torch.cuda.current_stream()
        if way.endswith("branched"):
            branch.wait_stream(here)
            here = branch
        if way.startswith("events"):
            event = torch.cuda.Event(enable_timing=True, external=capturing)
            event.record(here)
            keep.append(event)
        else:
            keep.append(stamps.stamp(here.cuda_stream))

    ways = ("plain", "events", "events, branched", "stamps", "stamps, branched")
    result: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    # eager
    host: dict[str, list[float]] = {w: [] for w in ways}
    gpu: dict[str, list[float]] = {w: [] for w in ways}
    for r in range(ROUNDS):
        for way in (ways if r % 2 == 0 else ways[::-1]):
            stamps.reset()
            keep: list = []
            step(way, keep)
            torch.cuda.current_stream().wait_stream(branch)
            torch.cuda.synchronize()
            keep.clear()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            started = time.perf_counter()
            for _ in range(STEPS):
                step(way, keep)
                if len(keep) > 2000:
                    keep.clear()
            took = time.perf_counter() - started
            torch.cuda.current_stream().wait_stream(branch)
            end.record()
            end.synchronize()
            host[way].append(took * 1e6 / STEPS)
            gpu[way].append(begin.elapsed_time(end) * 1e3 / STEPS)
    result["eager_host_us_a_step"] = {w: round(statistics.median(v), 2) for w, v in host.items()}
    result["eager_gpu_us_a_step"] = {w: round(statistics.median(v), 2) for w, v in gpu.items()}
    # graphs
    graphs: dict = {}
    for way in ways:
        stamps.reset()
        keep: list = []
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(way, keep)
            if way.endswith("branched"):
                torch.cuda.current_stream().wait_stream(branch)
        graphs[way] = (graph, keep)
    host = {w: [] for w in ways}
    gpu = {w: [] for w in ways}
    for r in range(ROUNDS):
        for way in (ways if r % 2 == 0 else ways[::-1]):
            graph = graphs[way][0]
            graph.replay()
            torch.cuda.synchronize()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            started = time.perf_counter()
            for _ in range(REPLAYS):
                graph.replay()
            took = time.perf_counter() - started
            end.record()
            end.synchronize()
            host[way].append(took * 1e6 / REPLAYS)
            gpu[way].append(begin.elapsed_time(end) * 1e3 / REPLAYS)
    result["graph_host_us_a_replay_call"] = {w: round(statistics.median(v), 2)
                                             for w, v in host.items()}
    result["graph_gpu_us_a_replay"] = {w: round(statistics.median(v), 2) for w, v in gpu.items()}
    # events re-armed at launch?
    graph, events = graphs["events"]
    torch.cuda.synchronize()
    before = sum(e.query() for e in events)
    torch.cuda._sleep(400_000_000)
    graph.replay()
    after = sum(e.query() for e in events)
    torch.cuda.synchronize()
    result["events_rearmed"] = {"done_before_launch": before, "done_right_after_launch": after,
                                "of": len(events)}
    # stamps, replay by replay, against a planted sleep before the 5th all-reduce
    cycles = _cycles_for(2.0)
    for way in ("stamps", "stamps, branched"):
        stamps.reset()
        keep = []
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(way, keep, plant=cycles)
            if way.endswith("branched"):
                torch.cuda.current_stream().wait_stream(branch)
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
        points = keep  # (16 points: before and after each all-reduce)
        fifth = [(stamps.time(points[8], k) - stamps.time(points[7], k)) / 1e6
                 for k in range(20)]
        whole = [(stamps.time(points[15], k) - stamps.time(points[0], k)) / 1e6
                 for k in range(20)]
        result[f"{way}: 5th before less 4th after, ms (2 ms planted)"] = _spread(fifth)
        result[f"{way}: first to last, ms"] = _spread(whole)
        result[f"{way}: runs counted"] = [stamps.count(p) for p in points[:2]]
    # the host's cost of the calls
    events = graphs["events"][1]
    n = 2000
    costs = {}
    for name, call in (
            ("query", lambda: events[0].query()),
            ("elapsed_time", lambda: events[0].elapsed_time(events[1])),
            ("Event()", lambda: torch.cuda.Event(enable_timing=True)),
            ("is_current_stream_capturing", torch.cuda.is_current_stream_capturing),
            ("current_stream", torch.cuda.current_stream),
            ("stamp", lambda: stamps.stamp(torch.cuda.current_stream().cuda_stream))):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        costs[name] = round((time.perf_counter() - t0) * 1e6 / n, 3)
    fresh = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    t0 = time.perf_counter()
    for e in fresh:
        e.record()
    costs["record (first, creates)"] = round((time.perf_counter() - t0) * 1e6 / n, 3)
    t0 = time.perf_counter()
    for e in fresh:
        e.record()
    costs["record (again)"] = round((time.perf_counter() - t0) * 1e6 / n, 3)
    result["host_us_each"] = costs
    torch.cuda.synchronize()
    dist.destroy_process_group()
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0


def _cycles_for(ms: float) -> int:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(50_000_000)
    end.record()
    end.synchronize()
    return int(50_000_000 * ms / start.elapsed_time(end))


def _spread(values: list[float]) -> dict:
    return {"n": len(values), "min": round(min(values), 3),
            "median": round(statistics.median(values), 3), "max": round(max(values), 3)}


if __name__ == "__main__":
    sys.exit(main())

"""What leaving autoannot on (the agent and its ring, ``AUTOANNOT_RING``) costs a graphed
decode loop: per replay, on 1 GPU (a 1-rank NCCL group) or 2 (``WORLD=2``).

    PYTHONPATH=. python benchmarks/gpu_decode.py [OUT.json]

Inference as it is served: a graph per batch size (1, 8, 32), each a decoder step of ``LAYERS``
layers (two ``Linear(HIDDEN)`` and a tensor-parallel all-reduce each); a decode loop replays
the graph of its batch size ``STEPS`` times. Modes, alternated ``ROUNDS`` times in one process:
"agent off" (graphs captured with the agent off), "ring on" (the agent on, its ring open,
graphs captured with it: their ledgers kept, each replay's launches written to the ring),
"ring + GPU times" (the same, each collective's GPU start timed: ``keep/gpu_clock.py``; how
many of a loop's launches got their GPU start is said), "ring + GPU times and graph ends"
(``AUTOANNOT_GPU_GRAPH_ENDS=1``: their GPU ends too). Each
round captures the graphs anew in its mode, then times a decode loop per batch size (CUDA
events around the loop; the replays are back to back, as a server's). Per replay: the median
over rounds of loop time / ``STEPS``, and the median and quartiles over rounds of the round's
ratio (GPU times against the ring in the same round: paired); beside it, the host's time a
replay call takes (the loop's ``replay()`` calls, timed on the CPU) and how many records the
ring got for the loop (each replay writes one a launch of its graph: ``LAYERS``). Prints a
table, then one line of JSON (also written to OUT.json).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

import autoannot
from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT
from autoannot.keep import gpu_clock, gpu_stamps
from autoannot.keep.gpu_clock import CudaEvents
from autoannot.keep.ring import Ring
from autoannot.traces.read import ring_files

DEFAULT_KIND = gpu_stamps.KIND
LAYERS, HIDDEN, STEPS = 16, 4096, 200
ROUNDS = int(os.environ.get("ROUNDS", "9"))  # (alternated rounds of every mode)
BATCHES = (1, 8, 32)
#: Other kernels for a graph's stamps (``keep/gpu_stamps.py``'s ``PTX_STORES``), each a mode of
#: its own: ``STAMP_KINDS=fenced,empty`` (what the kernel's body costs; ``empty`` times nothing).
STAMP_KINDS = [k for k in os.environ.get("STAMP_KINDS", "").split(",") if k]
MODES = ("agent off", "ring on", "ring + GPU times", "ring + GPU times and graph ends",
         *(f"ring + GPU times ({kind} stamps)" for kind in STAMP_KINDS))


def worker(rank: int, world: int, port: int, out_path: str | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    tp = dist.new_group(list(range(world)), group_desc="tp")
    torch.manual_seed(0)
    layers = [(torch.nn.Linear(HIDDEN, HIDDEN, device="cuda", dtype=torch.bfloat16),
               torch.nn.Linear(HIDDEN, HIDDEN, device="cuda", dtype=torch.bfloat16))
              for _ in range(LAYERS)]

    def step(x: torch.Tensor) -> torch.Tensor:
        for up, down in layers:
            x = down(torch.relu(up(x)))
            dist.all_reduce(x, group=tp)
        return x

    folder = tempfile.mkdtemp(prefix="autoannot-decode-")
    times: dict[str, dict[int, list[float]]] = {m: {b: [] for b in BATCHES} for m in MODES}
    host_us: dict[str, dict[int, list[float]]] = {m: {b: [] for b in BATCHES} for m in MODES}
    records: dict[int, list[int]] = {b: [] for b in BATCHES}
    writer: dict[int, list[bool]] = {b: [] for b in BATCHES}
    gpu_timed: dict[int, list[int]] = {b: [] for b in BATCHES}
    ring = None
    with torch.no_grad():
        for r in range(ROUNDS):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                if mode != "agent off":
                    ring = Ring(f"{folder}/r{r}{len(mode)}", 1 << 16)
                    if mode.startswith("ring + GPU"):  # (as AUTOANNOT_GPU_TIMES=1 makes it)
                        ring.gpu_source = CudaEvents
                    # (a graph's collectives stamped after too: what their ends cost)
                    gpu_clock.GRAPH_ENDS = mode.endswith("graph ends")
                    gpu_stamps.KIND = (mode.split("(")[1].split()[0] if mode.endswith("stamps)")
                                       else DEFAULT_KIND)
                    AGENT.state.open_journal(ring)
                    autoannot.enable()
                graphs = {}
                for batch in BATCHES:
                    x = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.bfloat16)
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        step(x)  # (warm-up before capture, as users do)
                    torch.cuda.current_stream().wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        step(x)
                    graphs[batch] = graph
                torch.cuda.synchronize()
                dist.barrier()
                for batch, graph in graphs.items():
                    graph.replay()
                    begin = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    count = ring.count if mode != "agent off" else 0
                    begin.record()
                    host = time.perf_counter()
                    for _ in range(STEPS):
                        graph.replay()
                    host = time.perf_counter() - host
                    end.record()
                    torch.cuda.synchronize()
                    times[mode][batch].append(begin.elapsed_time(end) * 1e3 / STEPS)
                    host_us[mode][batch].append(host * 1e6 / STEPS)
                    if mode == "ring on":  # (the ring's records of these replays)
                        records[batch].append(ring.count - count)
                        writer[batch].append(ring.writer is not None)
                    if mode.startswith("ring + GPU") and "empty" not in mode:  # (the GPU's
                        # times read, of the last loop; an empty stamp writes none, by design)
                        time.sleep(0.05)
                        gpu_timed[batch].append(_timed(ring, STEPS * LAYERS))
                del graphs
                if mode != "agent off":
                    autoannot.disable()
                    AGENT.state.close_journal(ring)
                    ring.close()
    if rank == 0:
        medians = {m: {b: statistics.median(t) for b, t in by.items()} for m, by in times.items()}
        print(f"decode loop, {LAYERS} layers x Linear({HIDDEN}) + all-reduce, {world} GPU(s): "
              f"us a replay, median of {ROUNDS} rounds x {STEPS} replays")
        hosts = {m: {b: statistics.median(t) for b, t in by.items()}
                 for m, by in host_us.items()}
        print(f"{'batch':>6} {'agent off':>10} {'ring on':>10} {'x':>7} {'+ GPU times':>12} "
              f"{'x ring':>7}   host us a replay call: off, on, GPU times; ring records a "
              "replay; GPU-timed launches of a loop's")
        for b in BATCHES:
            off, on = medians["agent off"][b], medians["ring on"][b]
            timed = medians["ring + GPU times"][b]
            print(f"{b:>6} {off:10.2f} {on:10.2f} {on / off:7.4f} {timed:12.2f} "
                  f"{timed / on:7.4f}   {hosts['agent off'][b]:.2f}, {hosts['ring on'][b]:.2f}, "
                  f"{hosts['ring + GPU times'][b]:.2f}; {set(records[b])} / {STEPS}; "
                  f"{sorted(set(gpu_timed[b]))} of {STEPS * LAYERS}")
        result = {"torch": torch.__version__, "gpus": torch.cuda.get_device_name(),
                  "world": world, "layers": LAYERS, "hidden": HIDDEN, "steps": STEPS,
                  "rounds": ROUNDS, "replay_us": medians,
                  "ratios": {b: round(medians["ring on"][b] / medians["agent off"][b], 4)
                             for b in BATCHES},
                  "gpu_times_ratios": {b: round(medians["ring + GPU times"][b]
                                                / medians["ring on"][b], 4) for b in BATCHES},
                  "gpu_times_and_graph_ends_ratios": {
                      b: round(medians["ring + GPU times and graph ends"][b]
                               / medians["ring on"][b], 4) for b in BATCHES},
                  "paired_gpu_times_ratios": {b: _paired(times["ring + GPU times"][b],
                                                         times["ring on"][b]) for b in BATCHES},
                  "paired_gpu_times_and_graph_ends_ratios": {
                      b: _paired(times["ring + GPU times and graph ends"][b],
                                 times["ring on"][b]) for b in BATCHES},
                  "paired_stamp_kinds_ratios": {
                      kind: {b: _paired(times[f"ring + GPU times ({kind} stamps)"][b],
                                        times["ring on"][b]) for b in BATCHES}
                      for kind in STAMP_KINDS},
                  "gpu_timed_launches": {b: sorted(set(n)) for b, n in gpu_timed.items()},
                  "host_us": hosts,
                  "ring_records": {b: sorted(set(n)) for b, n in records.items()},
                  "native_writer": {b: sorted(set(w)) for b, w in writer.items()},
                  "samples": times, "host_samples": host_us}
        print(json.dumps({k: v for k, v in result.items() if k != "samples"}))
        if out_path:
            with open(out_path, "x") as f:
                json.dump(result, f, indent=1)
    dist.destroy_process_group()


def _paired(samples: list[float], bases: list[float]) -> dict[str, float]:
    """The median and quartiles over rounds of a round's sample / its base in the same round
    (the rounds alternate the modes: a pair is adjacent in time)."""
    ratios = [s / b for s, b in zip(samples, bases, strict=True)]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return {"median": round(statistics.median(ratios), 4), "q1": round(q[0], 4),
            "q3": round(q[2], 4)}


def _timed(ring: Ring, last: int) -> int:
    """How many of the ring's last ``last`` launches have their GPU start."""
    one = ring_files.read(Path(ring.ring_path), last)
    return int((one.gpu["start_ns"] > 0).sum()) if one.gpu is not None else 0


def main() -> int:
    import socket

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = int(os.environ.get("WORLD", "1"))
    torch.multiprocessing.spawn(worker, args=(world, port, sys.argv[1] if len(sys.argv) > 1
                                              else None), nprocs=world)
    return 0


if __name__ == "__main__":
    sys.exit(main())

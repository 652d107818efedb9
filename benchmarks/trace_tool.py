"""``autoannot annotate`` against torch's ``torch.cuda._annotate_cuda_graph_trace`` on one
generated trace of about a million events: load + annotate + save, each tool in a fresh
process; wall time and peak memory added by the work.

    python benchmarks/trace_tool.py [--events N] [--keep DIR]

The trace mimics a profiled training loop: replays of two CUDA graphs (a cudaGraphLaunch, our
replay range, NCCL and compute kernels with their flow events, each kernel carrying a
"graph node id" so torch's tool has what it needs) among CPU operator events. Both tools get
annotations for the same kernels. Prints a table, then one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

KERNELS_PER_REPLAY, NCCL_EVERY = 20, 2
ANNOTATION = {"Collective name": "allreduce", "In msg nelems": 65536, "Out msg nelems": 65536,
              "Group size": 8, "dtype": "BFloat16", "In split size": "[]",
              "Out split size": "[]", "Process Group Name": "0",
              "Process Group Description": "default_pg",
              "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"}


def _event(fields: dict) -> str:
    return "    " + json.dumps(fields)[1:-1]


def generate(folder: Path, events: int) -> tuple[Path, Path, Path]:
    """The trace (Kineto layout), our ledger next to it, and torch's annotations pickle."""
    per_replay = 3 + 2 * KERNELS_PER_REPLAY
    replays = int(events * 0.6) // per_replay
    cpu_ops = events - replays * per_replay
    chunks: list[str] = []
    ts = 1_000_000.0
    graph_entries: dict[str, list] = {"autoannot.graph.0": [], "autoannot.graph.1": []}
    tools_id: dict[int, list] = {}
    for g, name in enumerate(graph_entries):
        for k in range(0, KERNELS_PER_REPLAY, NCCL_EVERY):
            annotation = {**ANNOTATION, "name": "all_reduce", "stream": 60 + g}
            graph_entries[name].append({"api": "all_reduce", "annotation": annotation,
                                        "kernels": ["AllReduce"]})
            tools_id[(g + 1) << 32 | (k + 1)] = [annotation]
    cpu_every = max(1, replays // max(1, cpu_ops)) if cpu_ops else 0
    cpu_left = cpu_ops
    for r in range(replays):
        g = r % 2
        correlation = r + 1
        chunks.append(_event({"ph": "X", "cat": "user_annotation",
                              "name": f"autoannot.replay:autoannot.graph.{g}", "pid": 1,
                              "tid": 1, "ts": ts, "dur": 30.0, "args": {"External id": r}}))
        chunks.append(_event({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch",
                              "pid": 1, "tid": 1, "ts": ts + 1, "dur": 20.0,
                              "args": {"correlation": correlation}}))
        chunks.append(_event({"ph": "s", "id": correlation, "pid": 1, "tid": 1, "ts": ts + 1,
                              "cat": "ac2g", "name": "ac2g"}))
        kts = ts + 40
        for k in range(KERNELS_PER_REPLAY):
            nccl = k % NCCL_EVERY == 0
            name = ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
                    if nccl else "void at::native::vectorized_elementwise_kernel<4>(int)")
            chunks.append(_event({
                "ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": kts,
                "dur": 5.0, "args": {"queued": 0, "device": 0, "context": 1, "stream": 7,
                                     "correlation": correlation,
                                     "graph node id": (g + 1) << 32 | (k + 1),
                                     "registers per thread": 96, "grid": [24, 1, 1],
                                     "block": [544, 1, 1]}}))
            chunks.append(_event({"ph": "f", "id": correlation, "pid": 0, "tid": 7, "ts": kts,
                                  "cat": "ac2g", "name": "ac2g", "bp": "e"}))
            kts += 6
        for _ in range(cpu_every if cpu_left > 0 else 0):
            chunks.append(_event({"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1,
                                  "tid": 1, "ts": ts + 25, "dur": 2.0,
                                  "args": {"External id": r, "Sequence number": r,
                                           "Fwd thread id": 0, "Record function id": 0}}))
            cpu_left -= 1
        ts += 200
    for i in range(cpu_left):
        chunks.append(_event({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1,
                              "tid": 1, "ts": ts + i, "dur": 0.5, "args": {"External id": i}}))
    header = ('\n  {\n    "schemaVersion": 1,\n    "distributedInfo": {"backend": "nccl", '
              '"rank": 0, "world_size": 8},\n  "traceEvents": [\n  {\n')
    text = header + "\n  },\n  {\n".join(chunks) + "\n  }\n  ],\n  \"traceName\": \"gen\"\n}"
    trace = folder / "trace.json"
    trace.write_text(text)
    ledger = {"format": "autoannot-ledger", "version": 1, "rank": 0, "graphs": graph_entries,
              "tools_id": {}}
    (folder / "trace.autoannot.json").write_text(json.dumps(ledger))
    torch_annotations = folder / "annotations.pkl"
    with open(torch_annotations, "wb") as f:
        pickle.dump(tools_id, f)
    return trace, folder / "trace.autoannot.json", torch_annotations


_RUNNER = textwrap.dedent("""
    import json, sys, time
    def status_kib(key):  # VmHWM is this process's own peak (ru_maxrss survives exec)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    def rss_kib():
        return status_kib("VmRSS:")
    tool, trace, extra, out = sys.argv[1:5]
    if tool == "torch":
        import pickle
        from pathlib import Path
        import torch.cuda._annotate_cuda_graph_trace as t
        base = rss_kib()
        start = time.perf_counter()
        data = t.load_trace(Path(trace))
        annotations = pickle.load(open(extra, "rb"))
        t.annotate_trace(data, annotations)
        t._move_overlapping_to_stream(data)
        t._fix_overlapping_timestamps(data)
        t.save_trace(data, Path(out))
    else:
        from autoannot.traces.read import annotate as tracetool
        base = rss_kib()
        start = time.perf_counter()
        report = tracetool.annotate_file(trace, out)
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM:")
    print(json.dumps({"seconds": seconds, "peak_added_mib": (peak - base) / 1024}))
""")


def run(tool: str, trace: Path, extra: Path, out: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", _RUNNER, tool, str(trace), str(extra),
                           str(out)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keep", metavar="DIR", help="keep the generated files in DIR")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"generating {args.events:,} events ...", file=sys.stderr)
        trace, _, pickle_path = generate(folder, args.events)
        size_mib = trace.stat().st_size / 2**20
        print(f"running torch's tool on {size_mib:.0f} MiB ...", file=sys.stderr)
        theirs = run("torch", trace, pickle_path, folder / "torch_out.json")
        print("running autoannot annotate ...", file=sys.stderr)
        ours = run("autoannot", trace, pickle_path, folder / "autoannot_out.json")
    print(f"{'tool':38} {'seconds':>8} {'peak MiB added':>15}   ({args.events:,} events, "
          f"{size_mib:.0f} MiB)")
    print(f"{'torch.cuda._annotate_cuda_graph_trace':38} {theirs['seconds']:8.2f} "
          f"{theirs['peak_added_mib']:15.0f}")
    print(f"{'autoannot annotate':38} {ours['seconds']:8.2f} {ours['peak_added_mib']:15.0f}")
    print(json.dumps({
        "events": args.events, "trace_mib": round(size_mib, 1),
        "torch_seconds": round(theirs["seconds"], 3), "ours_seconds": round(ours["seconds"], 3),
        "speedup": round(theirs["seconds"] / ours["seconds"], 2),
        "torch_peak_mib": round(theirs["peak_added_mib"]),
        "ours_peak_mib": round(ours["peak_added_mib"]),
        "memory_ratio": round(ours["peak_added_mib"] / theirs["peak_added_mib"], 3),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())

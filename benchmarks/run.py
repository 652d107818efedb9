"""All of autoannot's benchmarks in one command, one run: per-call cost, start-up, the trace
tool against torch's, and the GPU figures committed from the GPU machine.

    python benchmarks/run.py [--quick]

Prints tables, then one line of JSON. A benchmark, not a test: it never fails on a figure.
Takes about 3 minutes on a 2-core CPU machine (``--quick``: under 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import overhead  # noqa: E402


def _run_python(code: str, env_extra: dict[str, str]) -> float:
    # As after a normal install: byte-code compiled and cached (pip compiles on install).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AUTOANNOT") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(env_extra)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1e3


def startup(runs: int) -> dict[str, float]:
    """Median wall time (ms) of a Python start, with and without AUTOANNOT=1, interleaved."""
    import compileall

    import autoannot

    compileall.compile_dir(os.path.dirname(autoannot.__file__), quiet=1)
    cases = {"python -c pass": "pass", "import torch.distributed": "import torch.distributed"}
    out = {}
    for label, code in cases.items():
        n = runs if code == "pass" else max(3, runs // 6)
        off, on = [], []
        for _ in range(n):
            off.append(_run_python(code, {}))
            on.append(_run_python(code, {"AUTOANNOT": "1"}))
        out[label] = {"off_ms": statistics.median(off), "on_ms": statistics.median(on)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, a smaller trace")
    args = parser.parse_args(argv)
    calls, repeats = (500, 8) if args.quick else (2000, 15)

    print("1/4 per-call cost", file=sys.stderr)
    rows = overhead.run([2, 64, 1024], True, calls, repeats)
    print("2/4 start-up", file=sys.stderr)
    starts = startup(10 if args.quick else 30)
    print("3/4 the trace tool against torch's", file=sys.stderr)
    events = 200_000 if args.quick else 1_000_000
    tool_json = subprocess.run([sys.executable, str(HERE / "trace_tool.py"), "--events",
                                str(events)], capture_output=True, text=True, check=True)
    tool_lines = tool_json.stdout.strip().splitlines()
    tool = json.loads(tool_lines[-1])
    print("4/4 GPU figures (committed, from benchmarks/gpu_graph.py)", file=sys.stderr)
    gpu_file = HERE / "results_gpu_graph.json"
    gpu = json.loads(gpu_file.read_text()) if gpu_file.exists() else {}

    print(overhead.table(rows))
    print()
    print(f"{'start-up':28} {'off (ms)':>9} {'AUTOANNOT=1 (ms)':>17} {'added':>8}")
    for label, m in starts.items():
        print(f"{label:28} {m['off_ms']:9.1f} {m['on_ms']:17.1f} "
              f"{m['on_ms'] - m['off_ms']:8.1f}")
    print()
    print("\n".join(tool_lines[:-1]))
    if gpu:
        print()
        print(f"GPU ({gpu['gpus']}, torch {gpu['torch']}), a graph of {gpu['collectives']} "
              f"all_reduces: capture {gpu['capture_ms_off']:.2f} -> {gpu['capture_ms_on']:.2f} "
              f"ms ({gpu['capture_on_over_off']:.2f}x), replay {gpu['replay_us_off']:.0f} -> "
              f"{gpu['replay_us_on']:.0f} us ({gpu['replay_on_over_off']:.2f}x)")
    result = overhead.summary(rows)
    pass_case = starts["python -c pass"]
    result["startup_added_ms"] = round(pass_case["on_ms"] - pass_case["off_ms"], 2)
    dist_case = starts["import torch.distributed"]
    result["import_torch_distributed_added_ms"] = round(
        dist_case["on_ms"] - dist_case["off_ms"], 1)
    result.update({f"trace_tool_{k}": v for k, v in tool.items()})
    if gpu:
        result["gpu_capture_on_over_off"] = gpu["capture_on_over_off"]
        result["gpu_replay_on_over_off"] = gpu["replay_on_over_off"]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

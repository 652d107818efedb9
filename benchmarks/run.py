"""All of autoannot's benchmarks in one command, one run: per-call cost, start-up, the trace
tool against torch's, and the GPU figures committed from the GPU machine.

    python benchmarks/run.py [--quick]

Prints tables, then one line of JSON. A benchmark, not a test: it never fails on a figure.
Takes about 5 minutes on a 2-core CPU machine (``--quick``: about 2); with valgrind, one more
minute counting instructions (``instructions.py``), exact where timings on a shared machine are
not.
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

import instructions  # noqa: E402
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


def _imported(code: str, env_extra: dict[str, str]) -> dict[str, int]:
    """Module -> its own import time (us), from ``python -X importtime``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOANNOT")}
    env.update(env_extra)
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=env,
                          check=True, capture_output=True, text=True)
    own: dict[str, int] = {}
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if line.startswith("import time:") and parts[0].split(":")[1].strip().isdigit():
            own[parts[2].strip()] = int(parts[0].split(":")[1])
    return own


def added_modules(code: str = "import torch.distributed") -> dict[str, float]:
    """The modules ``AUTOANNOT=1`` adds to ``code`` and their own import time: the steady
    figure behind a wall-clock difference that torch's own import time variance hides."""
    off, on = _imported(code, {}), _imported(code, {"AUTOANNOT": "1"})
    added = {name: us for name, us in on.items() if name not in off}
    return {"modules": len(added), "own_ms": sum(added.values()) / 1e3,
            "outside_autoannot_wrapt": sorted(n for n in added
                                              if n.split(".")[0] not in ("autoannot", "wrapt"))}


def startup(runs: int) -> dict[str, float]:
    """Median wall time (ms) of a Python start, with and without AUTOANNOT=1, interleaved."""
    import compileall

    import autoannot

    compileall.compile_dir(os.path.dirname(autoannot.__file__), quiet=1)
    cases = {"python -c pass": "pass", "import torch.distributed": "import torch.distributed"}
    out = {}
    for label, code in cases.items():
        n = runs if code == "pass" else max(5, runs // 2)
        off, on = [], []
        for _ in range(n):
            off.append(_run_python(code, {}))
            on.append(_run_python(code, {"AUTOANNOT": "1"}))
        out[label] = {"off_ms": statistics.median(off), "on_ms": statistics.median(on)}
    return out


def jobs(events: int, files: int = 4) -> dict[str, float]:
    """``autoannot annotate`` over ``files`` rank traces: wall time with one process and with
    two (``-j``), best of 2 each; the outputs must be byte-identical."""
    import shutil
    import tempfile

    import trace_tool

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "gen").mkdir()
        trace, ledger, _ = trace_tool.generate(folder / "gen", events)
        traces = []
        for rank in range(files):
            traces.append(folder / f"rank{rank}.json")
            shutil.copy(trace, traces[-1])
            shutil.copy(ledger, folder / f"rank{rank}.autoannot")
        times: dict[int, float] = {}
        for n in (1, 2, 1, 2):
            out = folder / f"out{n}"
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "autoannot", "annotate", "-j", str(n), "-o",
                            str(out), *map(str, traces)], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            times[n] = min(times.get(n, float("inf")), time.perf_counter() - start)
        same = all((folder / "out1" / t.name).read_bytes() == (folder / "out2" / t.name)
                   .read_bytes() for t in traces)
    return {"files": files, "events_per_file": events, "j1_s": times[1], "j2_s": times[2],
            "speedup": times[1] / times[2], "identical": same}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, a smaller trace")
    args = parser.parse_args(argv)
    calls, repeats = (500, 8) if args.quick else (2000, 15)

    print("1/6 per-call cost", file=sys.stderr)
    rows = overhead.run([2, 64, 1024], True, calls, repeats)
    replays = overhead.replay_added_us(calls, repeats)
    print("2/6 start-up", file=sys.stderr)
    starts = startup(10 if args.quick else 30)
    modules = added_modules()
    print("3/6 the trace tool against torch's", file=sys.stderr)
    events = 200_000 if args.quick else 1_000_000
    tool_json = subprocess.run([sys.executable, str(HERE / "trace_tool.py"), "--events",
                                str(events)], capture_output=True, text=True, check=True)
    tool_lines = tool_json.stdout.strip().splitlines()
    tool = json.loads(tool_lines[-1])
    print("4/6 annotate -j over 4 rank traces", file=sys.stderr)
    parallel = jobs(50_000 if args.quick else 200_000)
    print("5/6 GPU figures (committed, from benchmarks/gpu_graph.py)", file=sys.stderr)
    gpu_file = HERE / "results_gpu_graph.json"
    gpu = json.loads(gpu_file.read_text()) if gpu_file.exists() else {}
    missing = instructions._missing()
    print("6/6 instructions a call (callgrind)" + (f": skipped, no {missing}" if missing else ""),
          file=sys.stderr)
    counted = {} if missing else _counted_instructions(500 if args.quick else 2000)

    print(overhead.table(rows))
    print(f"CUDAGraph.replay() (a stand-in graph: no CUDA here), added per call: "
          f"{replays['replay_added_us']:.2f} us with no profiler (off: "
          f"{replays['replay_us_off']:.2f} us), {replays['replay_profiler_added_us']:.2f} us "
          f"while torch's profiler records (its marker)")
    print()
    print(f"{'start-up':28} {'off (ms)':>9} {'AUTOANNOT=1 (ms)':>17} {'added':>8}")
    for label, m in starts.items():
        print(f"{label:28} {m['off_ms']:9.1f} {m['on_ms']:17.1f} "
              f"{m['on_ms'] - m['off_ms']:8.1f}")
    print(f"{'':28} AUTOANNOT=1 adds {modules['modules']} modules to `import "
          f"torch.distributed`, {modules['own_ms']:.1f} ms of their own import time; others: "
          f"{', '.join(modules['outside_autoannot_wrapt']) or 'none'}")
    print()
    print("\n".join(tool_lines[:-1]))
    print()
    print(f"autoannot annotate, {parallel['files']} traces of {parallel['events_per_file']:,} "
          f"events: -j 1 {parallel['j1_s']:.2f} s, -j 2 {parallel['j2_s']:.2f} s "
          f"({parallel['speedup']:.2f}x; outputs identical: {parallel['identical']})")
    if gpu:
        print()
        print(f"GPU ({gpu['gpus']}, torch {gpu['torch']}), a graph of {gpu['collectives']} "
              f"all_reduces: capture {gpu['capture_ms_off']:.2f} -> {gpu['capture_ms_on']:.2f} "
              f"ms ({gpu['capture_on_over_off']:.2f}x), replay {gpu['replay_us_off']:.0f} -> "
              f"{gpu['replay_us_on']:.0f} us ({gpu['replay_on_over_off']:.2f}x)")
    if counted:
        added = counted["added_over_unwrapped"]
        print()
        print(f"instructions a call added (callgrind, exact; below the Python API: "
              f"{counted['below_the_python_api']}): annotating {added['annotating']:,} = "
              f"{counted['annotating_over_helper']:.2f}x the hand-written helper's "
              f"{added['tutorial helper']:,}; in a capture {added['in capture']:,}; fast path "
              f"{added['fast path']:,}; CUDAGraph.replay() {counted['replay_added']:,}")
    result = overhead.summary(rows)
    result.update(replays)
    pass_case = starts["python -c pass"]
    result["startup_added_ms"] = round(pass_case["on_ms"] - pass_case["off_ms"], 2)
    dist_case = starts["import torch.distributed"]
    result["import_torch_distributed_added_ms"] = round(
        dist_case["on_ms"] - dist_case["off_ms"], 1)
    result["import_torch_distributed_added_modules_ms"] = round(modules["own_ms"], 1)
    result.update({f"trace_tool_{k}": v for k, v in tool.items()})
    result["annotate_j2_speedup"] = round(parallel["speedup"], 2)
    if gpu:
        result["gpu_capture_on_over_off"] = gpu["capture_on_over_off"]
        result["gpu_replay_on_over_off"] = gpu["replay_on_over_off"]
        result["gpu_capture_ms_on_first"] = gpu.get("capture_ms_on_first")
    if counted:
        result["instructions_annotating_over_helper"] = counted["annotating_over_helper"]
        result["instructions_added"] = counted["added_over_unwrapped"]
        result["instructions_replay_added"] = counted["replay_added"]
    print(json.dumps(result))
    return 0


def _counted_instructions(calls: int) -> dict:
    """benchmarks/instructions.py's JSON line (its own process, under callgrind)."""
    ran = subprocess.run([sys.executable, str(HERE / "instructions.py"), "--calls", str(calls)],
                         capture_output=True, text=True, check=True)
    return json.loads(ran.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())

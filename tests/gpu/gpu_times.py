"""Issue 65's device checks on one GPU: the GPU's own times of each collective, through the
agent as users turn it on (``AUTOANNOT=1``, ``AUTOANNOT_RING``, ``AUTOANNOT_WATCH=1``; no
autoannot code in the jobs).

    PYTHONPATH=. python tests/gpu/gpu_times.py OUT

1. eager, across ranks: two processes share the GPU on a gloo group with CUDA tensors; rank 1
   puts ``torch.cuda._sleep`` (``PLANT_MS``) on its stream before each all-reduce, its host on
   time. Rank 0's live watch must name rank 1's GPU (±20%, "from the GPU's times"); ``skew``
   on the rings must name rank 1 by the plant, and the same rings without their GPU files
   must not.
2. a graph, one rank (a 1-rank NCCL group): 8 all-reduces, ``PLANT_MS`` of sleep before the
   5th: every replay's 5th starts late by the plant on the GPU (replays one at a time); replays
   back to back: each time kept is its own replay's.
3. a replay held 8 s before its 5th collective: the live watch names that collective of that
   graph, from the GPU's times.
4. cost: a 1-rank NCCL all-reduce's host time a call and an eager bf16 step's time with the
   GPU times off, by events and by stamps (the ring on in all), alternated in one process.
Check 1 runs three times: the eager launches timed by torch's events, by stamps
(``AUTOANNOT_GPU_EAGER_STAMPS=1``), by the driver's events (``AUTOANNOT_GPU_DRIVER_EVENTS=1``).

``CHECKS=cost_nccl_1rank`` (names, commas) runs those alone; ``STEP_ROUNDS`` (14) the step's
alternations. Writes OUT/gpu_times.json (the figures and each check's verdict), the rings of
1-3 under OUT (small: 4,096 launches a ring), the ranks' logs; exits 1 where a check fails.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

PLANT_MS, STEPS, STEP_S = 20.0, 90, 0.04
HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]


def cycles_for(ms: float) -> int:
    """``torch.cuda._sleep`` cycles that take about ``ms`` on this GPU (measured)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):  # (the last, the GPU's clock up to speed)
        start.record()
        torch.cuda._sleep(50_000_000)
        end.record()
        end.synchronize()
    return int(50_000_000 * ms / start.elapsed_time(end))


def eager_rank(rank: int, port: int, out: str) -> None:
    """(A rank of check 1, its own process.)"""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    cycles = cycles_for(PLANT_MS)
    t = torch.ones(1 << 16, device="cuda")
    warm = dist.new_group(backend="gloo")
    dist.barrier(group=warm)  # (in step: their start-up is no lateness)
    line = 0
    held = []  # (the plant as the GPU ran it: the truth the checks hold the answers to)
    for _ in range(STEPS):
        time.sleep(STEP_S)
        if rank == 1:
            held.append((torch.cuda.Event(enable_timing=True),
                         torch.cuda.Event(enable_timing=True)))
            held[-1][0].record()
            torch.cuda._sleep(cycles)  # (its GPU late; its host goes on at once)
            held[-1][1].record()
        line = sys._getframe().f_lineno + 1
        dist.all_reduce(t)
    torch.cuda.synchronize()
    time.sleep(3.0)  # (the watch's last looks)
    dist.barrier(group=warm)
    Path(out, f"rank{rank}.line").write_text(str(line))
    if held:
        Path(out, "plant_ms").write_text(str(statistics.median(a.elapsed_time(b)
                                                                for a, b in held)))
    dist.destroy_process_group()


def graph_rank(out: str) -> None:
    """(Checks 2 and 3, one rank, its own process.)"""
    import torch
    import torch.distributed as dist

    from autoannot.traces.read import ring_files

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    tensors = [torch.ones(1 << 14, device="cuda") for _ in range(8)]
    found: dict = {}

    def captured(sleep: int) -> torch.cuda.CUDAGraph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for t in tensors:  # (warm-up, as users do)
                dist.all_reduce(t)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i, t in enumerate(tensors):
                if i == 4:
                    torch.cuda._sleep(sleep)
                found["line"] = sys._getframe().f_lineno + 1
                dist.all_reduce(t)
        return graph

    ring_path = Path(os.environ["AUTOANNOT_RING"], "rank0.ring")
    graph = captured(cycles_for(PLANT_MS))
    one_at_a_time, back_to_back = [], []
    for _ in range(10):
        graph.replay()
        torch.cuda.synchronize()
    time.sleep(0.05)  # (the clock's thread reads the last)
    one_at_a_time = _replays(ring_files.read(ring_path), 10)
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    time.sleep(0.05)
    back_to_back = _replays(ring_files.read(ring_path), 10)
    held = captured(cycles_for(8000.0))
    torch.cuda.synchronize()
    replayed = time.time()
    held.replay()
    time.sleep(6.0)  # (the host waits, as a job blocked on its GPU: the watch looks)
    torch.cuda.synchronize()
    time.sleep(0.5)
    found.update(one_at_a_time=one_at_a_time, back_to_back=back_to_back,
                 held_replayed_at=replayed)
    Path(out, "graph.json").write_text(json.dumps(found))
    dist.destroy_process_group()


def _replays(one, replays: int) -> list[dict]:
    """The last ``replays`` replays of the ring's graph: each collective's host entry and GPU
    start (ns; 0 unknown)."""
    kinds = {k for k, kind in one.kinds.items() if kind.get("graph")}
    mine = [i for i in range(len(one.records)) if int(one.records["kind"][i]) in kinds]
    mine = mine[-8 * replays:]
    return [{"entered_ns": [int(one.records["entered_ns"][i]) for i in mine[r * 8:r * 8 + 8]],
             "gpu_start_ns": [int(one.gpu["start_ns"][i]) for i in mine[r * 8:r * 8 + 8]],
             "gpu_end_ns": [int(one.gpu["end_ns"][i]) for i in mine[r * 8:r * 8 + 8]]}
            for r in range(replays)]


def cost_rank(out: str) -> None:
    """(Check 4, one rank.) A 1-rank NCCL all-reduce's host time a call: the ring on, the GPU
    times on and off, alternated; and the GPU's time of the same loop."""
    import torch
    import torch.distributed as dist

    import autoannot
    from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT
    from autoannot.keep import gpu_clock
    from autoannot.keep.gpu_clock import CudaEvents
    from autoannot.keep.ring import Ring

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    autoannot.enable()
    t = torch.ones(1 << 10, device="cuda")
    modes = ("ring", "ring + GPU times", "ring + GPU stamps")
    host: dict[str, list[float]] = {mode: [] for mode in modes}
    gpu: dict[str, list[float]] = {mode: [] for mode in modes}
    calls = 2000
    def ring_of(name: str, mode: str) -> Ring:
        """A ring opened as the agent's (``mode``: with the GPU times or not)."""
        ring = Ring(f"{out}/cost/{name}", 1 << 14)
        if mode != "ring":
            ring.gpu_source = CudaEvents
        gpu_clock.EAGER_STAMPS = mode.endswith("stamps")  # (AUTOANNOT_GPU_EAGER_STAMPS)
        AGENT.state.open_journal(ring)
        return ring

    def closed(ring: Ring) -> None:
        AGENT.state.close_journal(ring)
        ring.close()

    for r in range(12):
        for mode in (list(host) if r % 2 == 0 else list(host)[::-1]):
            ring = ring_of(f"r{r}{modes.index(mode)}", mode)
            for _ in range(50):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            started = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(t)
            took = time.perf_counter() - started
            end.record()
            end.synchronize()
            host[mode].append(took * 1e6 / calls)
            gpu[mode].append(begin.elapsed_time(end) * 1e3 / calls)
            closed(ring)
    # an eager step as training runs it: 4 layers' matmuls (bf16, 4096) and an all-reduce of
    # each layer's 32 MiB, the ring on, the GPU times on and off, alternated
    w = [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    step_ms: dict[str, list[float]] = {mode: [] for mode in modes}
    for r in range(int(os.environ.get("STEP_ROUNDS", "14"))):
        for mode in (list(step_ms) if r % 2 == 0 else list(step_ms)[::-1]):
            ring = ring_of(f"s{r}{len(mode)}", mode)
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(100):
                for layer in w:
                    y = x @ layer
                    dist.all_reduce(y)
            torch.cuda.synchronize()
            step_ms[mode].append((time.perf_counter() - started) * 1e3 / 100)
            closed(ring)
    # where the launching thread's time goes (stamps): the profile's top, on stderr
    import cProfile
    import io
    import pstats

    ring = ring_of("profiled", "ring + GPU stamps")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(500):
        dist.all_reduce(t)
    profile.disable()
    closed(ring)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(22)
    print(text.getvalue(), file=sys.stderr)
    result: dict = {mode: {"host_us_a_call": round(statistics.median(host[mode]), 3),
                           "gpu_us_a_call": round(statistics.median(gpu[mode]), 3)}
                    for mode in host}
    for mode in step_ms:
        result[mode]["step_ms"] = round(statistics.median(step_ms[mode]), 4)
    result["step_ratio"] = round(result["ring + GPU times"]["step_ms"] / result["ring"]["step_ms"],
                                 4)
    result["step_ratio_stamps"] = round(
        result["ring + GPU stamps"]["step_ms"] / result["ring"]["step_ms"], 4)
    result["host_us_added_a_call"] = round(result["ring + GPU times"]["host_us_a_call"]
                                           - result["ring"]["host_us_a_call"], 3)
    Path(out, "cost.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOANNOT")}
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               PYTHONPATH=f"{ROOT / 'autoannot' / '_hook'}:{ROOT}", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def _port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _skew_lead(rings: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "autoannot", "skew", "-q", "--json", str(rings)],
                         capture_output=True, text=True, env=_env(PYTHONPATH=str(ROOT)))
    return json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-2000:]}


def _late_of(found: dict, rank: int) -> list[float]:
    return [i["skew_us"] / 1e3 for i in found.get("instances", [])
            if i["straggler"] == rank and not i["warmup"]]


def check_eager(out: Path, stamps: bool = False, driver: bool = False) -> dict:
    """Check 1; ``stamps``: the eager launches timed by stamps (``AUTOANNOT_GPU_EAGER_STAMPS``);
    ``driver``: by the driver's events (``AUTOANNOT_GPU_DRIVER_EVENTS``)."""
    folder = out / ("eager_stamps" if stamps else "eager_driver" if driver else "eager")
    rings = folder / "rings"
    rings.mkdir(parents=True)
    port = _port()
    env = _env(AUTOANNOT="1", AUTOANNOT_RING=str(rings), AUTOANNOT_RING_LAUNCHES="4096",
               AUTOANNOT_WATCH="1", AUTOANNOT_WATCH_INTERVAL="0.25",
               AUTOANNOT_GPU_EAGER_STAMPS="1" if stamps else "0",
               AUTOANNOT_GPU_DRIVER_EVENTS="1" if driver else "0")
    logs = [(folder / f"rank{rank}.log").open("w") for rank in range(2)]
    try:
        procs = [subprocess.Popen([sys.executable, str(HERE), "eager-rank", str(rank), port,
                                   str(folder)], env=env, stderr=logs[rank])
                 for rank in range(2)]
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for log in logs:
            log.close()
    said = (folder / "rank0.log").read_text().splitlines()
    named = [line for line in said if "STRAGGLER" in line]
    line = int((folder / "rank1.line").read_text()) if codes == [0, 0] else -1
    plant = float((folder / "plant_ms").read_text()) if codes == [0, 0] else PLANT_MS
    lead = _skew_lead(rings)
    late = _late_of(lead, 1)
    host_only = folder / "host_only"
    host_only.mkdir()
    for path in rings.iterdir():
        if not path.name.endswith(".ring.gpu"):
            shutil.copy(path, host_only)
    host_late = _late_of(_skew_lead(host_only), 1)
    waited = _waited_ms(named[0]) if named else None
    checks = {
        "ranks_exit_0": codes == [0, 0],
        "watch_names_rank_1_once_from_gpu_times": len(named) == 1
        and "STRAGGLER: rank 1's GPU started last" in named[0] and "from the GPU's times"
        in named[0],
        "watch_delay_within_20pct": waited is not None and abs(waited - plant) <= 0.2 * plant,
        "skew_names_rank_1_at_its_line": bool(lead.get("lead")) and lead["lead"][0].startswith(
            "rank 1 held the others up most") and f"gpu_times.py:{line}" in lead["lead"][0],
        "skew_rank_1_late_by_plant": len(late) >= 0.9 * STEPS
        and abs(statistics.median(late) - plant) <= 0.2 * plant,
        "host_times_alone_do_not": len(host_late) < 0.9 * STEPS
        or statistics.median(host_late) < 0.5 * plant}
    return {"checks": checks, "plant_ms_as_run": round(plant, 3), "watch_lines": named,
            "skew_lead": lead.get("lead"),
            "skew_late_ms_rank1": _spread(late), "host_only_late_ms_rank1": _spread(host_late)}


def _waited_ms(line: str) -> float | None:
    try:
        value, unit = line.split("waiting ", 1)[1].split(" for it")[0].split()
    except (IndexError, ValueError):
        return None
    return float(value) / (1e3 if unit == "us" else 1.0)


def _spread(values: list[float]) -> dict:
    return ({"n": len(values), "min": round(min(values), 3),
             "median": round(statistics.median(values), 3), "max": round(max(values), 3)}
            if values else {"n": 0})


def check_graph(out: Path) -> dict:
    rings = out / "graph" / "rings"
    rings.mkdir(parents=True)
    env = _env(AUTOANNOT="1", AUTOANNOT_RING=str(rings), AUTOANNOT_RING_LAUNCHES="4096",
               AUTOANNOT_WATCH="1", AUTOANNOT_WATCH_INTERVAL="0.25", AUTOANNOT_WATCH_STALL="2",
               PORT=_port())
    with open(out / "graph" / "rank0.log", "w") as log:
        code = subprocess.run([sys.executable, str(HERE), "graph-rank", str(out / "graph")],
                              env=env, stderr=log, timeout=240).returncode
    said = (out / "graph" / "rank0.log").read_text().splitlines()
    found = json.loads((out / "graph" / "graph.json").read_text()) if code == 0 else {}
    fifth = [(r["gpu_start_ns"][4] - r["gpu_start_ns"][3]) / 1e6
             for r in found.get("one_at_a_time", [])
             if r["gpu_start_ns"][4] and r["gpu_start_ns"][3]]
    kept = [(r, i) for r in found.get("back_to_back", []) for i in range(8)
            if r["gpu_start_ns"][i]]
    own = all(r["gpu_start_ns"][i] >= r["entered_ns"][i] for r, i in kept)
    fifth_b2b = [(r["gpu_start_ns"][4] - r["gpu_start_ns"][3]) / 1e6
                 for r in found.get("back_to_back", [])
                 if r["gpu_start_ns"][4] and r["gpu_start_ns"][3]]
    hangs = [line for line in said if line.startswith("HANG:")]
    checks = {
        "exit_0": code == 0,
        "every_replay_timed": len(fifth) == 10,
        "fifth_late_by_plant": bool(fifth) and all(abs(f - PLANT_MS) <= 0.2 * PLANT_MS
                                                   for f in fifth),
        "back_to_back_times_are_their_own": own and all(
            abs(f - PLANT_MS) <= 0.2 * PLANT_MS for f in fifth_b2b),
        "held_replay_named_at_its_fifth": len(hangs) == 1 and hangs[0].startswith(
            "HANG: rank 0 holds the job up: its GPU has not started collective 5 of the 8 of "
            "graph ") and f"gpu_times.py:{found.get('line')}" in hangs[0]}
    return {"checks": checks, "fifth_after_fourth_ms": _spread(fifth),
            "back_to_back_kept": f"{len(kept)} of {8 * len(found.get('back_to_back', []))}",
            "back_to_back_fifth_ms": _spread(fifth_b2b), "hang_lines": hangs}


def check_cost(out: Path) -> dict:
    (out / "cost").mkdir(parents=True)
    with open(out / "cost" / "rank0.log", "w") as log:
        code = subprocess.run([sys.executable, str(HERE), "cost-rank", str(out)],
                              env=_env(PORT=_port()), stderr=log, timeout=240).returncode
    for path in (out / "cost").iterdir():  # (the cost's rings: not kept)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
    return json.loads((out / "cost.json").read_text()) if code == 0 else {"exit": code}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "eager-rank":
        eager_rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "graph-rank":
        graph_rank(sys.argv[2])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "cost-rank":
        cost_rank(sys.argv[2])
        return 0
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    import torch

    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
              "plant_ms": PLANT_MS}
    for name, check in (("eager_gloo_cuda", check_eager),
                        ("eager_gloo_cuda_stamps", lambda out: check_eager(out, stamps=True)),
                        ("eager_gloo_cuda_driver", lambda out: check_eager(out, driver=True)),
                        ("graph_nccl_1rank", check_graph),
                        ("cost_nccl_1rank", check_cost)):
        if os.environ.get("CHECKS") and name not in os.environ["CHECKS"].split(","):
            continue  # (CHECKS=a,b: those alone)
        started = time.time()
        try:
            result[name] = check(out)
        except Exception as exc:  # (each check apart: one failing leaves the others)
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
        result[name]["seconds"] = round(time.time() - started, 1)
        print(name, json.dumps(result[name])[:3000], flush=True)
    (out / "gpu_times.json").write_text(json.dumps(result, indent=1))
    failed = [f"{name}.{check}" for name in result if isinstance(result[name], dict)
              for check, ok in result[name].get("checks", {}).items() if not ok]
    print("failed:", failed or "none")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Probe for the native observer's design (1 GPU, a 1-rank NCCL group): where torch's
RecordFunction callbacks see a NCCL launch in a CUDA-graph capture, what torch's own record of it
holds, and what each way of asking costs a capture.

    python tests/gpu/observer_probe.py OUT.json

Builds autoannot/native/observer.cpp for this torch (into /tmp), without the agent.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.utils import cpp_extension


def build():
    return cpp_extension.load(
        name="autoannot_observer_probe", sources=["autoannot/native/observer.cpp"],
        build_directory=os.environ.get("PROBE_BUILD", "/tmp/observer_probe"),
        extra_cflags=["-O2", "-DNDEBUG"])


def ten_collectives(group):
    """Ten capturable collectives on ``group`` (1 rank)."""
    x = torch.ones(1024, device="cuda")
    h = torch.ones(256, device="cuda", dtype=torch.bfloat16)
    dist.all_reduce(x, group=group)
    dist.all_reduce(h, group=group)
    dist.all_gather_into_tensor(torch.empty(1024, device="cuda"), x, group=group)
    dist.reduce_scatter_tensor(torch.empty(1024, device="cuda"), x, group=group)
    dist.broadcast(x, group_src=0, group=group)
    dist.reduce(x, group_dst=0, group=group)
    dist.all_to_all_single(torch.empty(1024, device="cuda"), x, group=group)
    dist.all_gather([torch.empty(1024, device="cuda")], x, group=group)
    dist.reduce_scatter(torch.empty(1024, device="cuda"), [x], group=group)
    dist.all_reduce(torch.ones(7, device="cuda", dtype=torch.float16), group=group)


def record_param_comms_args(body):
    """torch's own record of each launch of ``body()`` (eager, profiled)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        body()
        torch.cuda.synchronize()
    path = "/tmp/probe_trace.json"
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    drop = ("External id", "Record function id", "Ev Idx", "Seq", "Comms Id", "Is P2P")
    return [{k: v for k, v in e["args"].items() if k not in drop}
            for e in sorted((e for e in events if e.get("name") == "record_param_comms"),
                            key=lambda e: e["ts"])]


def main(out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29655")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    sub = dist.new_group([0], group_desc="probe_sub")
    module = build()
    names = ["c10d::allreduce_", "c10d::_allgather_base_", "c10d::_reduce_scatter_base_",
             "c10d::broadcast_", "c10d::reduce_", "c10d::alltoall_base_", "c10d::allgather_",
             "c10d::reduce_scatter_"]
    collective_ops = {"allreduce": "c10d::allreduce_", "_allgather_base": "c10d::_allgather_base_",
                      "_reduce_scatter_base": "c10d::_reduce_scatter_base_",
                      "broadcast": "c10d::broadcast_", "reduce": "c10d::reduce_",
                      "all_to_allv": "c10d::alltoall_base_", "all_gather": "c10d::allgather_",
                      "reduce_scatter": "c10d::reduce_scatter_"}
    module.observe_ops(names, [[] for _ in names], collective_ops)
    result: dict = {"torch": torch.__version__}

    def body():
        ten_collectives(None)
        ten_collectives(sub)

    body()
    torch.cuda.synchronize()
    result["eager_records"] = record_param_comms_args(body)
    # captured, the observer asking for the process groups' Work ranges only
    for mode, operators in (("work", False), ("operators", True)):
        module.set_capture_inputs(operators)
        g = torch.cuda.CUDAGraph()
        module.set_demand(True, False, False)
        module.forget_streams()
        with torch.cuda.graph(g):
            body()
        module.set_demand(False, False, False)
        notes, _ = module.drain(0)
        result[f"notes_{mode}"] = [(op, kind, what) for _, op, kind, what, _, _ in notes]
        g.replay()
        torch.cuda.synchronize()
    module.set_capture_inputs(False)

    # what each way of asking costs a capture of many small ops and some collectives
    x = torch.ones(64, device="cuda")

    def workload():
        y = x
        for i in range(600):
            y = y * 1.0001 + 0.5
            if i % 60 == 0:
                dist.all_reduce(y)
        return y

    def capture_once():
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.cuda.graph(g):
            workload()
        took = time.perf_counter() - start
        module.drain(-1)
        return took * 1e3

    modes = {"off": None, "work": False, "operators": True}

    def switch(operators: bool | None) -> None:
        """Off (None), or registered for captures asking for operators or not."""
        if operators is None:
            module.set_demand(False, False, False)
        else:
            module.set_capture_inputs(operators)
            module.set_demand(True, False, False)

    times = {m: [] for m in modes}
    for _ in range(3):
        capture_once()
    for _ in range(12):
        for mode, operators in modes.items():
            switch(operators)
            times[mode].append(capture_once())
    module.set_demand(False, False, False)
    result["capture_ms"] = {m: statistics.median(t) for m, t in times.items()}
    eager = {m: [] for m in modes}
    for _ in range(12):
        for mode, operators in modes.items():
            switch(operators)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(3):
                workload()
            torch.cuda.synchronize()
            eager[mode].append((time.perf_counter() - start) * 1e3)
    module.set_demand(False, False, False)
    result["eager_ms_while_registered"] = {m: statistics.median(t) for m, t in eager.items()}

    # dispatch modes around a capture, the observer registered
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    for name, mode in (("CommDebugMode", CommDebugMode), ("PassThrough", PassThrough)):
        module.set_capture_inputs(False)
        module.set_demand(True, False, False)
        try:
            y = torch.arange(8, device="cuda", dtype=torch.float32)
            g = torch.cuda.CUDAGraph()
            with mode(), torch.cuda.graph(g):
                dist.all_reduce(y)
            g.replay()
            torch.cuda.synchronize()
            result[f"mode_{name}"] = {"ok": True, "values": y.tolist(),
                                      "notes": len(module.drain(0)[0])}
        except Exception as exc:
            result[f"mode_{name}"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
        module.set_demand(False, False, False)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if not k.startswith(("eager_rec", "notes"))},
                     indent=1))
    print("records", len(result["eager_records"]), "notes", len(result["notes_work"]),
          len(result["notes_operators"]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

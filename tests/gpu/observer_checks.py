"""On one GPU (a 1-rank NCCL group): the ledger of a captured graph against torch's own record
of the same launches, field for field, and captures under dispatch modes.

    AUTOANNOT=1 PYTHONPATH=autoannot/_hook:. python tests/gpu/observer_checks.py OUT.json

* Ten different collectives on the default group and on a subgroup, launched eagerly under
  torch's profiler (its ``record_param_comms`` args: the oracle; a 1-rank NCCL group records
  them on the CPU though it launches no kernel for most) and captured into a CUDA graph (the
  agent's ledger), then recorded (``record()``: the CPU op's keys too).
* The same collectives captured under a pass-through ``TorchDispatchMode`` and under
  ``CommDebugMode``: their results equal the agent-off results, their ledger entries right.

Run once with the native observer built (``autoannot build-native``) and once with
``AUTOANNOT_NATIVE=0`` (the Python layer); ``OUT.json`` says which ran.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist

import autoannot
from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT
from autoannot.describe import vocabulary as V

DROP = ("External id", "Record function id", "Ev Idx", "Seq", "Comms Id", "Is P2P",
        "Is asynchronized op")


def collectives(group: Any) -> list[Any]:
    """Ten different capturable collectives on ``group`` (one rank); their output tensors."""
    x = torch.arange(1024, device="cuda", dtype=torch.float32)
    h = torch.ones(256, device="cuda", dtype=torch.bfloat16)
    outs = [x, h]
    dist.all_reduce(x, group=group)
    dist.all_reduce(h, group=group)
    gathered = torch.empty(1024, device="cuda")
    dist.all_gather_into_tensor(gathered, x, group=group)
    scattered = torch.empty(1024, device="cuda")
    dist.reduce_scatter_tensor(scattered, x, group=group)
    b = torch.arange(16, device="cuda", dtype=torch.float16)
    dist.broadcast(b, group_src=0, group=group)
    r = torch.arange(32, device="cuda", dtype=torch.int64)
    dist.reduce(r, group_dst=0, group=group)
    a2a = torch.empty(64, device="cuda")
    dist.all_to_all_single(a2a, torch.arange(64, device="cuda", dtype=torch.float32),
                           group=group)
    lst = [torch.empty(128, device="cuda")]
    dist.all_gather(lst, torch.arange(128, device="cuda", dtype=torch.float32), group=group)
    rs = torch.empty(96, device="cuda")
    dist.reduce_scatter(rs, [torch.arange(96, device="cuda", dtype=torch.float32)], group=group)
    group_obj = group if group is not None else dist.group.WORLD
    p = torch.arange(48, device="cuda", dtype=torch.float32)
    group_obj.allreduce([p]).wait()  # from the ProcessGroup itself: no proxy sees it
    return [*outs, gathered, scattered, b, r, a2a, *lst, rs, p]


def torch_records(body: Any) -> list[dict[str, Any]]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        body()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return [{k: v for k, v in e["args"].items() if k not in DROP}  # ("wait": a work waited for)
            for e in sorted(events, key=lambda e: e["ts"]) if e.get("name") == "record_param_comms"
            and e["args"].get(V.COLLECTIVE_NAME) != "wait"]


def kernel_part(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in args.items() if k in V.KERNEL_KEYS}


def main(out: str) -> int:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29671")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    sub = dist.new_group([0], group_desc="checks_sub")
    assert autoannot.is_enabled(), "run with AUTOANNOT=1"

    def body() -> list[Any]:
        return collectives(None) + collectives(sub)

    body()  # warm-up: communicators made
    torch.cuda.synchronize()
    result: dict[str, Any] = {
        "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "observer": repr(AGENT.observer), "layer": repr(AGENT.layer),
        "native": AGENT.observer is not None}
    expected = torch_records(body)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    graph.replay()
    torch.cuda.synchronize()
    ledger = AGENT.captures.ledger_of(graph).entries
    with autoannot.record() as records:
        body()
        torch.cuda.synchronize()
    result["torch_records"] = expected
    result["ledger"] = [{"api": e["api"], "annotation": e["annotation"],
                         "call_site": e["call_site"]} for e in ledger]
    result["records"] = [{"api": r.api, "param_comms": r.param_comms} for r in records]
    kernel_equal = [kernel_part(e["annotation"]) == kernel_part(t)
                    for e, t in zip(ledger, expected, strict=False)]
    record_equal = [r.param_comms == t for r, t in zip(records, expected, strict=False)]
    result["ledger_vs_torch"] = f"{sum(kernel_equal)}/{len(expected)}"
    result["records_vs_torch"] = f"{sum(record_equal)}/{len(expected)}"
    result["counts"] = [len(expected), len(ledger), len(records)]
    ok = (len(ledger) == len(records) == len(expected) == 20 and all(kernel_equal)
          and all(record_equal))

    # dispatch modes around a capture
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    autoannot.disable()
    reference = [t.tolist() for t in body()]
    torch.cuda.synchronize()
    autoannot.enable()
    for name, mode in (("pass-through TorchDispatchMode", PassThrough),
                       ("CommDebugMode", CommDebugMode)):
        try:
            graph = torch.cuda.CUDAGraph()
            with mode(), torch.cuda.graph(graph):
                outputs = body()
            graph.replay()
            torch.cuda.synchronize()
            entries = AGENT.captures.ledger_of(graph).entries
            same = [t.tolist() for t in outputs] == reference
            right = [kernel_part(e["annotation"]) for e in entries] == [
                kernel_part(t) for t in expected]
            result[name] = {"ok": same and right, "results equal agent-off": same,
                            "ledger right": right, "entries": len(entries)}
        except Exception as exc:
            result[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:600]}
        ok = ok and result[name]["ok"]
    # DDP's buckets (launched by its reducer on autograd's device thread): a plain record()
    # around an eager step, and a whole captured step (PyTorch's recipe: a side stream)
    from torch.nn.parallel import DistributedDataParallel

    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ddp = DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=0.5)
        if hasattr(ddp, "_set_ddp_runtime_logging_sample_rate"):
            ddp._set_ddp_runtime_logging_sample_rate(2**31 - 1)
        data = torch.randn(16, 256, device="cuda")
        for _ in range(11):  # DDP rebuilds its buckets after the first step
            model.zero_grad(set_to_none=True)
            ddp(data).sum().backward()
        with autoannot.record() as records:
            model.zero_grad(set_to_none=True)
            ddp(data).sum().backward()
        torch.cuda.synchronize()
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ddp(data).sum().backward()
    graph.replay()
    torch.cuda.synchronize()
    parameters = sum(p.numel() for p in model.parameters())
    recorded = [r.annotation[V.IN_NELEMS] for r in records if r.api == "c10d.allreduce_"]
    captured = [e["annotation"][V.IN_NELEMS] for e in AGENT.captures.ledger_of(graph).entries
                if e["api"] == "c10d.allreduce_"]
    result["ddp"] = {"parameters": parameters, "recorded buckets": len(recorded),
                     "recorded elements": sum(recorded), "captured buckets": len(captured),
                     "captured elements": sum(captured)}
    ok = ok and sum(recorded) == sum(captured) == parameters and len(recorded) > 1
    result["verified"] = ok
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    summary = {k: v for k, v in result.items()
               if k not in ("torch_records", "ledger", "records")}
    print(json.dumps(summary, indent=1))
    print("VERIFIED" if ok else "NOT VERIFIED")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

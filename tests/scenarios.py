"""Calls run on real multi-rank groups by the tests (module-level: pickled by reference)."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from harness import torch_cannot

import autoannot


def _records(records: autoannot.Recording) -> list[dict[str, Any]]:
    return [{"api": r.api, "annotation": r.annotation, "param_comms": r.param_comms,
             "call_site": r.call_site} for r in records]


def four_rank_groups(rank: int, world: int) -> dict[str, Any]:
    """Sub-groups that are strided, not strided, a 2x2 mesh; roots and peers given as global
    ranks and as group ranks; funcol groups as ranks, mesh and (mesh, dim)."""
    from torch.distributed.device_mesh import init_device_mesh

    autoannot.enable()
    odd = dist.new_group([1, 3], group_desc="odd")  # strided: start 1, stride 2
    uneven = dist.new_group([0, 1, 3])  # not strided
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    out: dict[str, Any] = {"mesh": {}}
    for dim in ("dp", "tp"):
        pg = mesh.get_group(dim)
        out["mesh"][dim] = {"name": pg.group_name, "desc": pg.group_desc,
                            "ranks": dist.get_process_group_ranks(pg)}
    with autoannot.record(dispatcher=True) as records:
        if rank in (1, 3):
            dist.broadcast(torch.ones(5), src=3, group=odd)
            dist.broadcast(torch.ones(5), group=odd, group_src=0)
            if rank == 1:
                dist.send(torch.ones(6), dst=3, group=odd)
            else:
                dist.recv(torch.empty(6), src=1, group=odd)
            dist.all_to_all_single(torch.empty(4), torch.ones(4), group=odd)
        if rank in (0, 1, 3):
            dist.all_reduce(torch.ones(7, dtype=torch.float64), group=uneven)
            dist.reduce(torch.ones(3), dst=3, group=uneven)
        funcol.wait_tensor(funcol.all_reduce(torch.ones(8), "sum", (mesh, 1)))
        funcol.wait_tensor(funcol.all_gather_tensor(torch.ones(8), 0, mesh["dp"]))
        funcol.wait_tensor(funcol.reduce_scatter_tensor(torch.ones(8), "sum", 0, [0, 1, 2, 3]))
        dist.all_gather_into_tensor(torch.empty(16), torch.ones(8), group=mesh.get_group("tp"))
    out["records"] = _records(records)
    out["odd_name"] = getattr(odd, "group_name", None)  # non-members get no group object
    out["uneven_name"] = getattr(uneven, "group_name", None)
    return out


def wide_world(rank: int, world: int) -> list[dict[str, Any]]:
    """A 40-rank group: ranks and splits longer than the profiler's 30-item limit."""
    autoannot.enable()
    splits = list(range(world))
    with autoannot.record(dispatcher=True) as records:
        dist.all_to_all_single(torch.empty(sum(splits)), torch.ones(sum(splits)), splits, splits)
        dist.all_reduce(torch.ones(8, dtype=torch.complex64))
        dist.reduce(torch.ones(8, dtype=torch.complex64), dst=0)
    return _records(records)


def coalesced_point_to_point(rank: int, world: int) -> list[dict[str, Any]]:
    """isend/irecv inside a _coalescing_manager block: one launch, no collective args."""
    peer = (rank + 1) % world

    def block() -> None:
        with dist._coalescing_manager() as cm:
            works = [dist.isend(torch.ones(4), peer), dist.irecv(torch.empty(4), peer)]
        for work in works:
            work.wait()
        del cm

    try:
        block()  # agent off
    except Exception as exc:
        return torch_cannot("point-to-point in a coalescing block on gloo", exc)
    autoannot.enable()
    with autoannot.record(dispatcher=True) as records:
        block()
    return _records(records)


def functional_forms(rank: int, world: int) -> list[dict[str, Any]]:
    """Every functional collective form the installed torch has, once each."""
    autoannot.enable()
    group = dist.group.WORLD
    calls = {
        "all_reduce": lambda: funcol.all_reduce(torch.ones(6), "sum", group),
        "all_reduce_coalesced": lambda: funcol.all_reduce_coalesced(
            [torch.ones(2), torch.ones(3)], "sum", group),
        "all_gather_tensor": lambda: funcol.all_gather_tensor(torch.ones(6), 0, group),
        "all_gather_tensor_autograd": lambda: funcol.all_gather_tensor_autograd(
            torch.ones(6), 0, group),
        "all_gather_into_tensor_coalesced": lambda: funcol.all_gather_into_tensor_coalesced(
            [torch.ones(2), torch.ones(4)], group),
        "reduce_scatter_tensor": lambda: funcol.reduce_scatter_tensor(
            torch.ones(6), "sum", 0, group),
        "reduce_scatter_tensor_autograd": lambda: funcol.reduce_scatter_tensor_autograd(
            torch.ones(6), "sum", 0, group),
        "reduce_scatter_tensor_coalesced": lambda: funcol.reduce_scatter_tensor_coalesced(
            [torch.ones(2), torch.ones(4)], "sum", [0, 0], group),
        "all_to_all_single": lambda: funcol.all_to_all_single(
            torch.ones(6, 2), [5, 1] if rank == 0 else [1, 5], [5, 1] if rank == 0 else [1, 5],
            group),
        "all_to_all_single_autograd": lambda: funcol.all_to_all_single_autograd(
            torch.ones(6), None, None, group),
        "broadcast": lambda: funcol.broadcast(torch.ones(6), 1, group),
    }
    out = []
    for name, call in calls.items():
        if not hasattr(funcol, name):
            continue
        with autoannot.record(dispatcher=True) as records:
            result = call()
            for tensor in result if isinstance(result, list) else [result]:
                funcol.wait_tensor(tensor)
        out.append({"call": name, "records": _records(records)})
    return out


def fsdp_and_dtensor(rank: int, world: int) -> dict[str, Any]:
    """FSDP2 forward/backward and DTensor redistributions, agent off then on: same numbers,
    and the collectives annotated with their mesh groups."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    shape = (world // 2, 2) if world >= 4 else (world,)
    names = ("rep", "dp") if world >= 4 else ("dp",)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    dp = mesh["dp"]

    def step() -> list[list[float]]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                    torch.nn.Linear(8, 4))
        fully_shard(model, mesh=dp)
        x = torch.randn(3, 8) + rank
        loss = model(x).square().mean()
        loss.backward()
        grads = [p.grad.to_local().flatten().tolist() for p in model.parameters()]
        t = distribute_tensor(torch.arange(16.0).reshape(4, 4), dp, [Shard(0)])
        full = t.redistribute(dp, [Replicate()]).to_local()
        return [[loss.item()], *grads, full.flatten().tolist()]

    from torch.profiler import ProfilerActivity, profile

    try:
        off = step()
    except Exception as exc:
        return torch_cannot("FSDP2 on the CPU", exc)
    autoannot.enable()
    with profile(activities=[ProfilerActivity.CPU]) as prof, \
            autoannot.record(dispatcher=True) as records:
        on = step()
    autoannot.disable()
    return {"same": off == on, "records": _records(records),
            "dp_desc": dp.get_group().group_desc,
            "gloo": [e.name for e in prof.events() if e.name.startswith("gloo:")]}


#: What the profiler calls each launch on gloo ("gloo:<title>") -> the eager names it may be.
GLOO_TITLES = {
    "gloo:all_reduce": {"allreduce", "allreduce_coalesced"},
    "gloo:broadcast": {"broadcast"},
    "gloo:all_gather": {"all_gather", "_allgather_base", "allgather_into_tensor_coalesced"},
    "gloo:barrier": {"barrier"},
    "gloo:reduce_scatter": {"reduce_scatter", "_reduce_scatter_base",
                            "reduce_scatter_tensor_coalesced"},
}

DDP_CONFIGS = {
    "buckets": {},  # several buckets, rebuilt after the first step
    "static_graph": {"static_graph": True},
    "no_sync": {"no_sync_steps": 2},  # gradient accumulation: 2 steps without communication
    "fp16_hook": {"hook": "fp16"},  # a Python comm hook (compresses to fp16, then dist.*)
    "bucket_view": {"gradient_as_bucket_view": True},
    "subgroup": {"subgroup": True},  # DDP on a 2-rank group of a larger world
}


def ddp_training(rank: int, world: int, names: list[str]) -> dict[str, Any]:
    """DDP (gloo, CPU) steps inside ``record()`` with the profiler on: what the agent recorded,
    what gloo launched (the profiler's ``gloo:*`` ranges, one per launch), DDP's buckets."""
    from contextlib import nullcontext

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel
    from torch.profiler import ProfilerActivity, profile

    autoannot.enable()
    out: dict[str, Any] = {}
    pairs = [dist.new_group([r, r + 1]) for r in range(0, world, 2)] if world > 2 else []
    for name in names:
        config = DDP_CONFIGS[name]
        group = pairs[rank // 2] if config.get("subgroup") and pairs else dist.group.WORLD
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4))
        x = torch.randn(8, 16) + rank
        steps: list[list[dict[str, Any]]] = []
        with profile(activities=[ProfilerActivity.CPU]) as prof, \
            autoannot.record(dispatcher=True) as records:
            ddp = DistributedDataParallel(
                model, process_group=group, bucket_cap_mb=0.002,
                static_graph=config.get("static_graph", False),
                gradient_as_bucket_view=config.get("gradient_as_bucket_view", False))
            if config.get("hook") == "fp16":
                ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
            optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
            accumulate = config.get("no_sync_steps", 0)
            for step in range(3 + accumulate):
                before = len(records)
                quiet = ddp.no_sync() if 0 < step <= accumulate else nullcontext()
                with quiet:
                    ddp(x).square().mean().backward()
                if not (0 < step <= accumulate):
                    optimizer.step()
                    optimizer.zero_grad()
                steps.append(_records(records[before:]))
            # gloo (torch < 2.10) closes a launch's profiler range in its worker thread after
            # the work completes: give the last range time to close before the profiler stops.
            time.sleep(0.1)
        out[name] = {
            "records": _records(records),
            "steps": steps,
            "gloo": [e.name for e in prof.events() if e.name.startswith("gloo:")],
            "buckets": [b.buffer().numel() for b in ddp.reducer._get_zeros_like_grad_buckets()],
            "group": {"name": group.group_name, "size": group.size()},
        }
    return out

"""Calls run on real multi-rank groups by the tests (module-level: pickled by reference)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

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
    with autoannot.record() as records:
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
    with autoannot.record() as records:
        dist.all_to_all_single(torch.empty(sum(splits)), torch.ones(sum(splits)), splits, splits)
        dist.all_reduce(torch.ones(8, dtype=torch.complex64))
        dist.reduce(torch.ones(8, dtype=torch.complex64), dst=0)
    return _records(records)


def coalesced_point_to_point(rank: int, world: int) -> list[dict[str, Any]]:
    """isend/irecv inside a _coalescing_manager block: one launch, no collective args."""
    autoannot.enable()
    peer = (rank + 1) % world
    with autoannot.record() as records:
        with dist._coalescing_manager() as cm:
            works = [dist.isend(torch.ones(4), peer), dist.irecv(torch.empty(4), peer)]
        for work in works:
            work.wait()
        del cm
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
        with autoannot.record() as records:
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

    off = step()
    autoannot.enable()
    with autoannot.record() as records:
        on = step()
    autoannot.disable()
    return {"same": off == on, "records": _records(records),
            "dp_desc": dp.get_group().group_desc}

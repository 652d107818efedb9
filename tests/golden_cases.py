"""The golden calls (shared/golden/record_eager_nccl.py ``cases()``), replayed on CPU tensors.

Each label names the call behind a golden record; ``replay`` runs them on this rank's process
group with the agent on and returns what it recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import agent_hooks as hooks
import torch
import torch.distributed as dist

import autoannot

#: Calls gloo cannot run (ReduceOp.AVG, uneven all_gather, ...): compared on the fake group.
GLOO_CANNOT_RUN = frozenset({
    "all_reduce_2d_avg",
    "reduce_scatter_tensor_avg_bf16_kw",
    "all_gather_list_uneven",
    "all_gather_into_tensor_kw_stacked",  # gloo wants a flat output
})


class Direct:
    """A single call kept as data, so the agent can also describe it without running it."""

    def __init__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.function, self.args, self.kwargs = function, args, kwargs

    def __call__(self) -> Any:
        return self.function(*self.args, **self.kwargs)


#: The fake group moves no data: a receiver cannot unpickle what it "received".
FAKE_CANNOT_RUN = frozenset({"broadcast_object_list"})


def _groups() -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    groups = {"tp": dist.new_group([0, 1], group_desc="tp"), "nodesc": dist.new_group([0, 1])}
    groups["mesh"] = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    return groups


def calls(rank: int, world: int, groups: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    import torch.distributed._functional_collectives as funcol

    def f(n: int, dt: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.ones(n, dtype=dt)

    def e(n: int, dt: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(n, dtype=dt)

    tp, dp = groups["tp"], groups["nodesc"]
    peer_splits = [1, 3] if rank == 0 else [3, 1]
    world_group = dist.group.WORLD

    def batch() -> None:
        ops = [dist.P2POp(dist.isend, f(300), (rank + 1) % world),
               dist.P2POp(dist.irecv, e(300), (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    def coalesced_all_reduce() -> None:
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.all_reduce(f(100))
            dist.all_reduce(f(200))
        cm.wait()

    def coalesced_all_gather() -> None:
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.all_gather_into_tensor(e(200), f(100))
            dist.all_gather_into_tensor(e(400), f(200))
        cm.wait()

    return {
        "all_reduce_f32_default": lambda: dist.all_reduce(f(1 << 20)),
        "all_reduce_bf16_max": lambda: dist.all_reduce(f(4096, torch.bfloat16),
                                                       op=dist.ReduceOp.MAX),
        "all_reduce_int64_kw_group_tp": lambda: dist.all_reduce(tensor=f(333, torch.int64),
                                                                group=tp),
        "all_reduce_f16_nodesc_group": lambda: dist.all_reduce(f(1000, torch.float16), group=dp),
        "all_reduce_async_wait": lambda: dist.all_reduce(f(2048), async_op=True).wait(),
        "all_reduce_2d_avg": lambda: dist.all_reduce(f(64 * 32).view(64, 32),
                                                     op=dist.ReduceOp.AVG),
        "all_gather_into_tensor_flat": lambda: dist.all_gather_into_tensor(e(2 * 1000), f(1000)),
        "all_gather_into_tensor_kw_stacked": lambda: dist.all_gather_into_tensor(
            output_tensor=e(2 * 50).view(2, 50), input_tensor=f(50)),
        "all_gather_list_equal": lambda: dist.all_gather([e(777), e(777)], f(777)),
        "all_gather_list_bf16_tp": lambda: dist.all_gather(
            [e(10, torch.bfloat16), e(10, torch.bfloat16)], f(10, torch.bfloat16), group=tp),
        "all_gather_list_uneven": Direct(dist.all_gather, [e(3), e(5)], f(3 if rank == 0 else 5)),
        "reduce_scatter_tensor_sum": lambda: dist.reduce_scatter_tensor(e(1000), f(2000)),
        "reduce_scatter_tensor_avg_bf16_kw": lambda: dist.reduce_scatter_tensor(
            output=e(64, torch.bfloat16), input=f(128, torch.bfloat16), op=dist.ReduceOp.AVG),
        "reduce_scatter_list": lambda: dist.reduce_scatter(e(500), [f(500), f(500)]),
        "broadcast_src0": lambda: dist.broadcast(f(100), 0),
        "broadcast_src1_tp_kw": lambda: dist.broadcast(tensor=f(100), src=1, group=tp),
        "broadcast_group_src": lambda: dist.broadcast(f(100), group=tp, group_src=1),
        "reduce_dst1": lambda: dist.reduce(f(256), 1),
        "reduce_dst0_min": lambda: dist.reduce(f(256), dst=0, op=dist.ReduceOp.MIN),
        "all_to_all_single_equal": lambda: dist.all_to_all_single(e(1024), f(1024)),
        "all_to_all_single_splits": lambda: dist.all_to_all_single(e(4), f(4), peer_splits,
                                                                   peer_splits),
        "all_to_all_list": lambda: dist.all_to_all([e(7), e(7)], [f(7), f(7)]),
        "gather_dst0": lambda: dist.gather(f(16), [e(16), e(16)] if rank == 0 else None, dst=0),
        "scatter_src0": lambda: dist.scatter(e(16), [f(16), f(16)] if rank == 0 else None, src=0),
        "send_recv": lambda: dist.send(f(512), 1) if rank == 0 else dist.recv(e(512), 0),
        "isend_irecv": lambda: (dist.isend(f(512), 1) if rank == 0 else dist.irecv(e(512), 0))
        .wait(),
        "batch_isend_irecv": batch,
        "barrier": lambda: dist.barrier(),
        "coalescing_manager_all_reduce": coalesced_all_reduce,
        "coalescing_manager_all_gather": coalesced_all_gather,
        "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([f(10), f(20)]),
        "funcol_all_reduce": lambda: funcol.wait_tensor(funcol.all_reduce(f(1000), "sum",
                                                                          world_group)),
        "funcol_all_gather_tensor": lambda: funcol.wait_tensor(
            funcol.all_gather_tensor(f(1000), 0, world_group)),
        "funcol_reduce_scatter_tensor": lambda: funcol.wait_tensor(
            funcol.reduce_scatter_tensor(f(1000), "sum", 0, world_group)),
        "funcol_all_to_all_single": lambda: funcol.wait_tensor(
            funcol.all_to_all_single(f(1000), None, None, world_group)),
        "funcol_broadcast": lambda: funcol.wait_tensor(funcol.broadcast(f(10), 0, world_group)),
        "funcol_mesh_all_reduce": lambda: funcol.wait_tensor(
            funcol.all_reduce(f(100), "sum", (groups["mesh"], 0))),
        "all_gather_object": lambda: dist.all_gather_object([None, None], {"rank": rank}),
        "broadcast_object_list": lambda: dist.broadcast_object_list([{"a": 1}], src=0),
    }


def without_proxies() -> None:
    """Take the agent's Python proxies out (originals back in every module) while it stays on:
    what it records then comes from its dispatcher kernels under the Python API alone."""
    import torch.distributed._functional_collectives  # noqa: F401  (patched on import)

    from autoannot.agent import patching

    for patch in hooks.AGENT.installed():
        if isinstance(patch, patching.Patch):
            patch.undo()


def launched_apis(call: Callable[[], Any]) -> list[str]:
    """The c10d functions the installed torch calls for ``call``, the agent off: which
    collectives an object collective launches differs by torch release (2.11 exchanges sizes
    with an all_gather of a list, 2.15 with a single-tensor all-gather)."""
    from autoannot.describe import collectives

    c10d = dist.distributed_c10d
    seen: list[str] = []
    originals = {row.api: getattr(c10d, row.api) for row in collectives.COLLECTIVES
                 if row.module == collectives.C10D and row.role is collectives.Role.LAUNCH
                 and hasattr(c10d, row.api)}

    def spy(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def called(*args: Any, **kwargs: Any) -> Any:
            seen.append(name)
            return function(*args, **kwargs)
        return called

    for name, function in originals.items():
        setattr(c10d, name, spy(name, function))
    try:
        call()
    finally:
        for name, function in originals.items():
            setattr(c10d, name, function)
    return seen


def _fails_without_agent(call: Callable[[], Any], via: str) -> bool:
    """Whether ``call`` raises with the agent off too (the backend of this torch lacks it:
    gloo has no alltoall before 2.10, no reduce_scatter of lists before 2.7)."""
    autoannot.disable()
    try:
        call()
        return False
    except Exception:
        return True
    finally:
        autoannot.enable()
        if via == "ops":
            without_proxies()


def replay(rank: int, world: int, skip: frozenset[str] = frozenset(),
           via: str = "proxies") -> dict[str, Any]:
    """Run every golden call with the agent on; label -> records (or the error it raised).
    ``via="ops"``: with the Python proxies taken out, so only the ``c10d::`` and
    ``_c10d_functional::`` kernels see the calls."""
    import warnings

    warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations of old names
    autoannot.enable()
    if via == "ops":
        without_proxies()
    groups = _groups()
    results: dict[str, Any] = {}
    launched: dict[str, list[str]] = {}
    for label, call in calls(rank, world, groups).items():
        if label.endswith("_object") and label not in skip:
            autoannot.disable()
            launched[label] = launched_apis(call)
            autoannot.enable()
            if via == "ops":
                without_proxies()
            dist.barrier()
    results["#launched"] = launched
    for label, call in calls(rank, world, groups).items():
        if label in skip:
            continue
        try:
            with autoannot.record(dispatcher=True) as records:
                call()
            results[label] = [
                {"api": r.api, "annotation": r.annotation, "param_comms": r.param_comms,
                 "call_site": r.call_site}
                for r in records
            ]
        except Exception as exc:
            if not isinstance(call, Direct):
                error = f"{type(exc).__name__}: {exc}"
                results[label] = {"torch_cannot" if _fails_without_agent(call, via) else
                                  "error": error}
            else:  # the group cannot run it: compare what the agent computes for it
                annotation = autoannot.describe_call(call.function, *call.args, **call.kwargs)
                results[label] = [{"api": annotation["name"], "annotation": annotation,
                                   "described": True}]
        dist.barrier()
    agent = hooks.AGENT  # which observers this process made below the Python API
    results["#observers"] = {"python layer": agent.layer is not None,
                             "native observer": agent.observer is not None,
                             "group hooks": agent.hooks is not None}
    return results

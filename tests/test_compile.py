"""torch.compile with the agent on: no graph break, eager results, the compiled graph unchanged,
and the collectives the compiled code launches annotated like their eager calls.

Real 2- and 4-rank gloo groups; backends ``aot_eager`` (AOTAutograd's graph, run as Python) and
``inductor`` (generated code; C++ kernels on the CPU). The CUDA-graph mode
(``mode="reduce-overhead"``) runs on the GPU machine: ``tests/gpu/compile_graphs.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import agent_hooks as hooks
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import verify_traces
from harness import run_ranks, skip_if_torch_cannot, torch_cannot

import autoannot

BACKENDS = ("aot_eager", "inductor")


def collectives_body(x: torch.Tensor, c10d: Any = dist) -> tuple[torch.Tensor, ...]:
    """c10d and functional collectives, as a user writes them (no autoannot code)."""
    world = dist.get_world_size()
    y = x * 2
    c10d.all_reduce(y)
    gathered = torch.empty(world * y.numel(), dtype=y.dtype)
    c10d.all_gather_into_tensor(gathered, y)
    shard = torch.empty_like(y)
    c10d.reduce_scatter_tensor(shard, gathered, op=dist.ReduceOp.MAX)
    z = funcol.all_reduce(shard + 1, "sum", dist.group.WORLD)
    g = funcol.all_gather_tensor(z, 0, dist.group.WORLD)
    r = funcol.reduce_scatter_tensor(g, "sum", 0, dist.group.WORLD)
    a = funcol.all_to_all_single(g, None, None, dist.group.WORLD)
    b = funcol.broadcast(r, 0, dist.group.WORLD)
    c = funcol.all_reduce_coalesced([b, a * 2], "max", dist.group.WORLD)
    return y, gathered, shard, r, a, b, *c


class AsTraced:
    """The c10d calls of ``collectives_body`` as Dynamo traces them: the functional collective,
    then a copy into the c10d call's output. Run eagerly, this launches what the compiled code
    launches (torch's own remap functions refuse to run outside tracing)."""

    @staticmethod
    def all_reduce(tensor: torch.Tensor) -> None:
        tensor.copy_(funcol.all_reduce(tensor, "sum", dist.group.WORLD))

    @staticmethod
    def all_gather_into_tensor(output: torch.Tensor, tensor: torch.Tensor) -> None:
        output.copy_(funcol.all_gather_tensor(tensor, 0, dist.group.WORLD))

    @staticmethod
    def reduce_scatter_tensor(output: torch.Tensor, tensor: torch.Tensor, op: Any) -> None:
        output.copy_(funcol.reduce_scatter_tensor(tensor, op.name.lower(), 0, dist.group.WORLD))


def _graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def _records_without_names(records: list[Any]) -> list[dict[str, Any]]:
    return [{**{k: v for k, v in r.annotation.items() if k != "name"}, **r.param_comms}
            for r in records]


def compiled_vs_eager(rank: int, world: int, backend: str) -> dict[str, Any]:

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    x = torch.arange(8.0) + rank
    autoannot.disable()
    reference = collectives_body(x.clone())  # eager, agent off
    autoannot.enable()
    with autoannot.record(dispatcher=True) as eager:
        again = collectives_body(x.clone(), AsTraced())
    compiled = torch.compile(collectives_body, fullgraph=True, backend=backend)
    try:
        with autoannot.record(dispatcher=True):  # compiled where it runs: the key included
            compiled(x.clone())
    except Exception as exc:
        autoannot.disable()
        torch._dynamo.reset()
        try:  # the same with the agent off: whose failure is it?
            torch.compile(collectives_body, fullgraph=True, backend=backend)(x.clone())
        except Exception as off:
            return torch_cannot(f"compiling c10d collectives with {backend}", off)
        raise exc
    with autoannot.record(dispatcher=True) as records:
        outputs = compiled(x.clone())
    return {
        "breaks": _graph_breaks(),
        "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
        "bitwise": all(torch.equal(a, b) for a, b in zip(outputs, reference, strict=True))
        and all(torch.equal(a, b) for a, b in zip(again, reference, strict=True)),
        "compiled": _records_without_names(records),
        "eager": _records_without_names(eager),
        "compiled_names": [r.api for r in records],
        "registered": list(hooks.AGENT.layer.ops) if hooks.AGENT.layer is not None else [],
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_collectives_are_annotated_like_eager(backend: str, figures) -> None:
    results = run_ranks(compiled_vs_eager, 2, args=(backend,))
    skip_if_torch_cannot(results)
    for rank, result in enumerate(results):
        assert result["breaks"] == 0, rank
        assert result["graphs"] == 1, rank
        assert result["bitwise"], rank
        if hooks.group_hooks_observe():  # torch's process-group hooks: nothing on the dispatcher
            assert not result["registered"]
        else:
            assert result["registered"], "no dispatcher kernel registered"
        # Every collective the compiled code launched carries the record of the same eager call.
        assert result["compiled"] == result["eager"], rank
        assert all(n.startswith("_c10d_functional.") for n in result["compiled_names"])
    names = sorted({n for n in results[0]["compiled_names"]})
    figures[f"torch.compile {backend}: annotated collectives per rank (graph breaks)"] = (
        f"{len(results[0]['compiled'])} = eager ({results[0]['breaks']}), ops: {', '.join(names)}")


def mesh_body(x: torch.Tensor, mesh: Any) -> tuple[torch.Tensor, ...]:
    dp = funcol.all_reduce(x, "avg", (mesh, 0))
    tp = funcol.all_gather_tensor(dp * 3, 0, (mesh, 1))
    return dp, funcol.reduce_scatter_tensor(tp, "sum", 0, (mesh, 1))


def compiled_mesh(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    x = torch.arange(4.0) * (rank + 1)
    try:
        reference = mesh_body(x, mesh)  # agent off
    except Exception as exc:
        return torch_cannot("funcol on a gloo mesh", exc)
    autoannot.enable()
    with autoannot.record(dispatcher=True) as eager:
        again = mesh_body(x, mesh)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(mesh_body, fullgraph=True, backend="aot_eager")
    with autoannot.record(dispatcher=True) as records:
        outputs = compiled(x, mesh)
    return {"breaks": _graph_breaks(),
            "bitwise": all(torch.equal(a, b) for a, b in zip(outputs, reference, strict=True))
            and all(torch.equal(a, b) for a, b in zip(again, reference, strict=True)),
            "compiled": _records_without_names(records), "eager": _records_without_names(eager)}


def test_compiled_mesh_collectives_carry_their_mesh_groups() -> None:
    results = run_ranks(compiled_mesh, 4)
    skip_if_torch_cannot(results)
    for result in results:
        assert result["breaks"] == 0 and result["bitwise"]
        assert result["compiled"] == result["eager"]
        descs = [r["Process Group Description"] for r in result["compiled"]]
        assert descs[0].startswith("mesh_dp") and descs[1].startswith("mesh_tp"), descs
    assert results[0]["compiled"][0]["Process Group Ranks"] == "[0, 2]"
    assert results[1]["compiled"][1]["Process Group Ranks"] == "[0, 1]"


def graph_code(rank: int, world: int, record: bool) -> str | dict[str, str]:
    """The graph AOTAutograd hands its compiler, as code."""
    from torch._dynamo.backends.common import aot_autograd

    seen: list[str] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        seen.append(gm.code)
        return gm.forward

    if record:
        autoannot.enable()
    torch._dynamo.reset()
    compiled = torch.compile(collectives_body, fullgraph=True,
                             backend=aot_autograd(fw_compiler=keep))
    try:
        if record:
            with autoannot.record(dispatcher=True):
                compiled(torch.ones(4))
        else:
            compiled(torch.ones(4))
    except Exception as exc:
        if record:
            raise
        return torch_cannot("compiling c10d collectives", exc)
    return "\n".join(seen)


def test_the_compiled_graph_does_not_change_with_the_agent() -> None:
    off = run_ranks(graph_code, 2, args=(False,))
    skip_if_torch_cannot(off)
    on = run_ranks(graph_code, 2, args=(True,))
    assert "_c10d_functional.all_reduce" in off[0]
    assert on == off


OP_CALLS = {  # invalid calls of the ops: the same error with and without our kernel
    "bad reduce op": lambda ops, t: ops.all_reduce_.default(t, "nope", "0"),
    "unknown group": lambda ops, t: ops.all_reduce.default(t, "sum", "no-such-group"),
    "bad splits": lambda ops, t: ops.all_to_all_single.default(t, [4], [9], "0"),
    "wrong out shape": lambda ops, t: ops.all_gather_into_tensor_out.default(
        t, 2, "0", out=torch.empty(3)),
    "bad root": lambda ops, t: ops.broadcast_.default(t, 7, "0"),
    "not a tensor": lambda ops, t: ops.all_reduce.default([t], "sum", "0"),
    "ok": lambda ops, t: ops.all_reduce.default(t, "sum", "0"),
}


def op_outcomes(rank: int, world: int) -> dict[str, list[Any]]:
    ops = torch.ops._c10d_functional

    def outcome(call: Any) -> Any:
        try:
            result = ops.wait_tensor.default(call(ops, torch.arange(4.0) + rank))
            return ["returned", result.tolist()]
        except Exception as exc:
            return ["raised", type(exc).__name__, str(exc).split("\n")[0]]

    results: dict[str, list[Any]] = {}
    for label, call in OP_CALLS.items():
        autoannot.disable()
        off = outcome(call)
        autoannot.enable()
        with autoannot.record(dispatcher=True) as records:
            on = outcome(call)
        results[label] = [off, on, len(records)]
    autoannot.disable()
    results["kernel left after disable"] = [torch._C._dispatch_has_kernel_for_dispatch_key(
        "_c10d_functional::all_reduce", "BackendSelect")]
    return results


def test_ops_raise_and_return_what_torch_does() -> None:
    (results,) = run_ranks(op_outcomes, 1)
    for label in OP_CALLS:
        off, on, _ = results[label]
        assert on == off, label
    assert results["bad reduce op"][0][0] == "raised"
    assert results["ok"][2] == 1  # the valid call was recorded once
    assert results["kernel left after disable"] == [False]


def kernel_lifecycle(rank: int, world: int) -> dict[str, Any]:
    """In a fresh process: when our kernels are on torch's dispatcher, and who reaches them."""
    import threading

    from autoannot.observe import python_layer

    ops = torch.ops._c10d_functional
    key = torch._C._dispatch_key_parse(python_layer.KEY)
    seen: dict[str, Any] = {}
    ours = ("_c10d_functional::all_reduce_", "c10d::allreduce_")

    def registered() -> bool:
        return all(torch._C._dispatch_has_kernel_for_dispatch_key(op, python_layer.KEY)
                   for op in ours)

    def none_registered() -> bool:
        return not any(torch._C._dispatch_has_kernel_for_dispatch_key(op, python_layer.KEY)
                       for op in ours)

    def included() -> bool:
        return torch._C._dispatch_tls_is_dispatch_key_included(key)

    def call() -> list[float]:
        return ops.wait_tensor.default(ops.all_reduce.default(torch.ones(2), "sum", "0")).tolist()

    def recorded_apis(dispatcher: bool) -> list[str]:
        with autoannot.record(dispatcher=dispatcher) as records:
            seen.setdefault("inside: registered, key included", []).append(
                (registered(), included()))
            call()
        return [r.api for r in records]

    seen["fresh process"] = none_registered()
    autoannot.enable()
    autoannot.enable()
    layer = hooks.AGENT.layer
    seen["enabled, idle"] = (none_registered(), included())
    seen["record()"] = recorded_apis(False)
    other = threading.Event()
    helper = threading.Thread(target=other.wait)  # another thread alive throughout
    helper.start()
    seen["record(dispatcher=True)"] = recorded_apis(True)
    seen["after it: kernels stay, key gone"] = (registered(), included())
    seen["pass-through result"] = call()
    seen["registrations"] = layer.registrations
    graph = type("Graph", (), {})()
    hooks.begin_capture(lambda: None, graph, (), {})
    seen["capture in progress: key included"] = included()
    hooks.end_capture(lambda: None, graph, (), {})
    seen["capture over: key gone"] = not included()
    autoannot.disable()  # no thread holds the layer: its kernels go
    seen["disabled"] = none_registered()
    autoannot.enable()
    seen["on again: record(dispatcher=True)"] = (recorded_apis(True), layer.registrations)
    autoannot.disable()
    other.set()
    helper.join()
    return seen


def test_kernels_are_reached_only_where_something_is_annotated(monkeypatch) -> None:
    """Registered at the first capture or ``record(dispatcher=True)``, reached only on the
    thread holding one (whatever other threads are alive), removed by ``disable()``. (The
    Python layer's: on a torch whose groups take hooks, with them turned off.)"""
    monkeypatch.setenv("AUTOANNOT_GROUP_HOOKS", "0")
    (seen,) = run_ranks(kernel_lifecycle, 2, "fake", ranks=(0,))
    op = "_c10d_functional.all_reduce"
    assert seen == {
        "fresh process": True, "enabled, idle": [True, False],  # (JSON: lists, not tuples)
        "record()": [], "record(dispatcher=True)": [op],
        "after it: kernels stay, key gone": [True, False], "pass-through result": [1.0, 1.0],
        "registrations": 1, "capture in progress: key included": True,
        "capture over: key gone": True, "disabled": True,
        "on again: record(dispatcher=True)": [[op], 2],
        "inside: registered, key included": [[False, False], [True, True], [True, True]],
    }


def test_complex_tensors_are_counted_as_on_the_gpu(fake_world) -> None:
    """Functional collectives send complex tensors as view_as_real: the eager kernels of these
    calls on 2 x H200 (tests/gpu/compile_graphs.py) say Float and twice the elements."""
    trace = Path(__file__).parent / "data" / "gpu" / "compile" / "complex_rank0.json"
    eager = verify_traces.eager_calls(trace)
    c = torch.zeros(64, dtype=torch.complex64)
    world, ops = dist.group.WORLD, torch.ops._c10d_functional
    calls = [(funcol.all_reduce, (c, "sum", world)), (funcol.broadcast, (c, 0, world)),
             (funcol.all_gather_tensor, (c, 0, world)),
             (funcol.reduce_scatter_tensor, (c, "sum", 0, world)),
             (ops.all_reduce_, (c, "sum", "0")), (ops.all_reduce, (c, "avg", "0"))]
    described = [verify_traces.vocab(autoannot.describe_call(f, *args)) for f, args in calls]
    assert [d["dtype"] for d in eager] == ["Float"] * len(calls)
    assert described == eager


def _autograd_step(x: torch.Tensor) -> None:
    y = funcol.all_gather_tensor_autograd(x * 2, 0, dist.group.WORLD)
    z = funcol.reduce_scatter_tensor_autograd(y * 3, "sum", 0, dist.group.WORLD)
    # square: a contiguous grad (torch < 2.10's backward ops refuse sum's expanded one)
    funcol.wait_tensor(z).square().sum().backward()


def autograd_forms(rank: int, world: int) -> dict[str, Any]:
    reference = torch.arange(4.0, requires_grad=True)
    _autograd_step(reference)  # agent off
    x = torch.arange(4.0, requires_grad=True)
    autoannot.enable()
    with autoannot.record(dispatcher=True) as records:
        _autograd_step(x)
    # What the backward launches, called eagerly: the same ops on tensors of the grads' shapes.
    with autoannot.record(dispatcher=True) as eager:
        funcol.all_gather_tensor(torch.ones(4), 0, dist.group.WORLD)
        funcol.reduce_scatter_tensor(torch.ones(8), "sum", 0, dist.group.WORLD)
    return {"apis": [r.api for r in records], "grad": x.grad.tolist(),
            "reference_grad": reference.grad.tolist(),
            "backward": _records_without_names(records[2:]),
            "eager": _records_without_names(eager)}


def test_backward_collectives_of_autograd_forms_are_annotated() -> None:
    """The backward of funcol's autograd forms launches collectives from C++ (autograd nodes
    calling the ops): the observer below the Python API annotates them like the same eager
    calls."""
    for result in run_ranks(autograd_forms, 2):
        assert result["apis"] == [
            "funcol.all_gather_tensor_autograd", "funcol.reduce_scatter_tensor_autograd",
            "_c10d_functional.all_gather_into_tensor", "_c10d_functional.reduce_scatter_tensor"]
        assert result["backward"] == result["eager"]
        assert result["grad"] == result["reference_grad"]
        assert any(result["grad"])

"""enable()/disable(): proxies everywhere, originals back by identity, other wrappers respected."""

from __future__ import annotations

import inspect
import sys

import agent_hooks as hooks
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d
import wrapt

import autoannot
from autoannot.describe import collectives

ROWS = [row for row in collectives.COLLECTIVES
        if row.module in collectives.FUNCTION_MODULES
        and hasattr(sys.modules[row.module], row.api)]


def originals() -> dict[tuple[str, str], object]:
    found = {}
    for row in ROWS:
        obj = getattr(sys.modules[row.module], row.api)
        found[(row.module, row.api)] = getattr(obj, "__wrapped__", obj) if isinstance(
            obj, wrapt.FunctionWrapper) else obj
    return found


def namespaces_of(name: str, obj: object) -> list[str]:
    return sorted(m for m, mod in list(sys.modules.items())
                  if getattr(mod, "__dict__", None) is not None
                  and isinstance(mod.__dict__, dict) and mod.__dict__.get(name) is obj)


def test_enable_wraps_every_namespace_and_disable_restores_identity(fake_world) -> None:
    before = originals()
    homes = {key: namespaces_of(key[1], obj) for key, obj in before.items()}
    assert "torch.distributed" in homes[(collectives.C10D, "all_reduce")]
    autoannot.enable()
    try:
        assert autoannot.is_enabled()
        for (module, api), original in before.items():
            for namespace in homes[(module, api)]:
                proxy = sys.modules[namespace].__dict__[api]
                assert isinstance(proxy, wrapt.FunctionWrapper), (namespace, api)
                assert proxy.__wrapped__ is original
        assert dist.all_reduce is c10d.all_reduce  # one proxy, shared by all namespaces
    finally:
        autoannot.disable()
    assert not autoannot.is_enabled()
    for (module, api), original in before.items():
        for namespace in homes[(module, api)]:
            assert sys.modules[namespace].__dict__[api] is original, (namespace, api)
    assert not hooks.AGENT.installed()


def test_enable_disable_cycles_never_double_wrap(fake_world) -> None:
    original = dist.all_reduce
    for _ in range(3):
        autoannot.enable()
        autoannot.enable()  # idempotent
        assert dist.all_reduce.__wrapped__ is original
        assert not isinstance(dist.all_reduce.__wrapped__, wrapt.FunctionWrapper)
        with autoannot.record() as records:
            dist.all_reduce(torch.ones(4))
        assert records.apis() == ["all_reduce"]
        autoannot.disable()
        autoannot.disable()
        assert dist.all_reduce is original


def test_proxies_look_like_the_originals(fake_world, agent) -> None:
    for row in ROWS:
        proxy = getattr(sys.modules[row.module], row.api)
        original = proxy.__wrapped__
        assert proxy.__name__ == original.__name__
        assert proxy.__doc__ == original.__doc__
        assert proxy.__module__ == original.__module__
        assert inspect.signature(proxy) == inspect.signature(original)
        assert proxy == original  # torch compares with == in places (P2POp, Dynamo remaps)


class _CountsSelfLookups:
    """A callable that counts how often it is asked for ``__self__`` (a function has none)."""

    def __init__(self) -> None:
        self.asked = 0

    def __call__(self, *args: object) -> tuple[object, ...]:
        return args

    def __getattr__(self, name: str) -> object:
        if name == "__self__":
            self.asked += 1
        raise AttributeError(name)


def test_a_proxy_call_does_not_ask_its_function_for_a_bound_instance() -> None:
    """wrapt asks an unbound wrapper's function for ``__self__`` at every call: for a function
    an AttributeError raised and cleared, ~80% of a pass-through proxy's cost (1.5 -> 0.3 us a
    call here). A collective's proxy asks once, when it is made."""
    from autoannot.agent.proxies import CollectiveProxy

    function = _CountsSelfLookups()
    seen: list[object] = []

    def wrapper(wrapped, instance, args, kwargs):
        seen.append(instance)
        return wrapped(*args, **kwargs)

    proxy = CollectiveProxy(function, wrapper)
    asked_at_build = function.asked
    assert [proxy(i) for i in range(3)] == [(0,), (1,), (2,)]
    assert function.asked == asked_at_build  # (before: one lookup a call)
    assert len(seen) == 3


def test_a_proxy_binds_as_a_method_as_its_function_does(fake_world, agent) -> None:
    """Put on a class, the proxy binds (or not) exactly as the collective it wraps."""
    original = dist.all_reduce.__wrapped__

    class Holder:
        theirs = original
        ours = dist.all_reduce

    holder = Holder()
    raised = []
    for attribute in ("theirs", "ours"):
        with pytest.raises(TypeError) as error:  # the holder is passed as the tensor
            getattr(holder, attribute)(torch.ones(2))
        raised.append(str(error.value))
    assert raised[0] == raised[1] and "Holder" in raised[0]
    tensor = torch.ones(2)
    assert Holder.ours(tensor) is None and Holder.theirs(tensor) is None


def test_a_wrapper_stacked_on_ours_survives_disable(fake_world) -> None:
    calls = []

    def theirs(wrapped, instance, args, kwargs):
        calls.append("theirs")
        return wrapped(*args, **kwargs)

    original = dist.all_reduce
    autoannot.enable()
    ours = dist.all_reduce
    stacked = wrapt.FunctionWrapper(ours, theirs)
    dist.all_reduce = stacked
    try:
        autoannot.disable()
        assert dist.all_reduce is stacked  # theirs stays
        assert c10d.all_reduce is original  # where ours was on top, the original is back
        with autoannot.record() as records:
            dist.all_reduce(torch.ones(2))
        assert calls == ["theirs"] and len(records) == 0  # ours is an inert pass-through
        autoannot.enable()
        with autoannot.record() as records:
            dist.all_reduce(torch.ones(2))
        assert records.apis() == ["all_reduce"]  # one record, not two
        autoannot.disable()
    finally:
        dist.all_reduce = original


def test_a_wrapper_installed_before_ours_keeps_running(fake_world) -> None:
    calls = []

    def theirs(wrapped, instance, args, kwargs):
        calls.append("theirs")
        return wrapped(*args, **kwargs)

    original = dist.all_reduce
    before = wrapt.FunctionWrapper(original, theirs)
    dist.all_reduce = before
    try:
        autoannot.enable()
        assert dist.all_reduce is not before and dist.all_reduce.__wrapped__ is before
        with autoannot.record() as records:
            dist.all_reduce(torch.ones(2))
        assert calls == ["theirs"] and records.apis() == ["all_reduce"]
        autoannot.disable()
        assert dist.all_reduce is before
        assert c10d.all_reduce is original
    finally:
        dist.all_reduce = original


def test_functional_collectives_are_wrapped(fake_world, agent) -> None:
    assert isinstance(funcol.all_reduce, wrapt.FunctionWrapper)
    with autoannot.record() as records:
        funcol.wait_tensor(funcol.all_reduce(torch.ones(3), "sum", dist.group.WORLD))
    assert records.apis() == ["funcol.all_reduce"]


def test_capture_methods_are_wrapped_and_restored(agent) -> None:
    graphs = sys.modules["torch.cuda.graphs"]
    assert isinstance(graphs.CUDAGraph.__dict__["capture_begin"], wrapt.FunctionWrapper)
    autoannot.disable()
    assert not isinstance(graphs.CUDAGraph.__dict__["capture_begin"], wrapt.FunctionWrapper)


def test_no_records_without_recorder_and_none_after_disable(fake_world) -> None:
    autoannot.enable()
    dist.all_reduce(torch.ones(2))  # no recorder open: nothing is kept anywhere
    with autoannot.record() as records:
        dist.all_reduce(torch.ones(2))
        autoannot.disable()
        dist.all_reduce(torch.ones(2))
    assert records.apis() == ["all_reduce"]


@pytest.mark.parametrize("enabled_at_build", [False, True])
def test_p2p_op_identity_checks_keep_working(fake_world, enabled_at_build: bool) -> None:
    """torch tests ``op.op is isend``: P2POps built before or during enable() work in
    batch_isend_irecv while enabled and after disable()."""
    if enabled_at_build:
        autoannot.enable()
    ops = [dist.P2POp(dist.isend, torch.ones(3), 1), dist.P2POp(dist.irecv, torch.empty(3), 1)]
    autoannot.enable()
    try:
        with autoannot.record() as records:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        assert records.apis() == ["isend", "irecv"]
        assert records[0].annotation["Dst Rank"] == 1
        assert records[1].annotation["Src Rank"] == 1
    finally:
        autoannot.disable()
    for work in dist.batch_isend_irecv(ops):
        work.wait()

"""A wrapped call returns and raises exactly what the original does; the agent's own failures
never reach the caller (one warning per API instead)."""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from harness import run_ranks

import autoannot
from autoannot.base import diagnostics
from autoannot.describe import groups


def bad_calls():
    """Calls that raise; each is a function of the current ``dist``/``funcol`` namespaces."""
    return {
        "all_reduce None": lambda: dist.all_reduce(None),
        "all_reduce str": lambda: dist.all_reduce("x"),
        "all_reduce bad op": lambda: dist.all_reduce(torch.ones(2), op="bogus"),
        "all_reduce bad kwarg": lambda: dist.all_reduce(torch.ones(2), bogus=1),
        "all_reduce unknown group": lambda: dist.all_reduce(torch.ones(2), group=object()),
        "broadcast both src kinds": lambda: dist.broadcast(torch.ones(2), src=0, group_src=0),
        "send to self": lambda: dist.send(torch.ones(2), dst=0),
        "gather list on non-root": lambda: dist.gather(torch.ones(2), [torch.ones(2)], dst=1),
        "all_gather_into_tensor None": lambda: dist.all_gather_into_tensor(None, torch.ones(2)),
        "reduce_scatter_tensor wrong types": lambda: dist.reduce_scatter_tensor(1, 2),
        "all_to_all_single no tensors": lambda: dist.all_to_all_single(None, None),
        "all_gather not a list": lambda: dist.all_gather(torch.ones(2), torch.ones(2)),
        "batch_isend_irecv empty": lambda: dist.batch_isend_irecv([]),
        "funcol all_reduce bad group": lambda: funcol.all_reduce(torch.ones(2), "sum", 3.5),
        "funcol a2a one split": lambda: funcol.all_to_all_single(
            torch.ones(4), [2, 2], None, dist.group.WORLD),
    }


def outcome(call):
    try:
        value = call()
    except Exception as exc:
        return ("raised", type(exc), re.sub(r"0x[0-9a-f]+", "0x?", str(exc)))  # object ids
    return ("returned", type(value), None)


@pytest.mark.parametrize("path", ["fast path", "annotating"])
def test_bad_arguments_raise_exactly_as_without_agent(fake_world, path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = {name: outcome(call) for name, call in bad_calls().items()}
        assert all(o[0] == "raised" for o in expected.values()), expected
        autoannot.enable()
        try:
            if path == "annotating":
                with autoannot.record() as records:
                    got = {name: outcome(call) for name, call in bad_calls().items()}
                assert len(records) == 0  # a call that raised launched nothing
            else:
                got = {name: outcome(call) for name, call in bad_calls().items()}
        finally:
            autoannot.disable()
    assert got == expected


def test_return_values_are_the_originals(fake_world, agent) -> None:
    with autoannot.record():
        assert dist.all_reduce(torch.ones(2)) is None
        work = dist.all_reduce(torch.ones(2), async_op=True)
        assert isinstance(work, dist.Work)
        out = funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD)
        assert isinstance(out, torch.Tensor)
        funcol.wait_tensor(out)
        objects = [None, None]
        assert dist.all_gather_object(objects, {"a": 1}) is None


def test_a_metadata_failure_warns_once_per_api_and_the_call_still_runs(
    fake_world, agent, monkeypatch
) -> None:
    def broken(name):
        raise LookupError("no facts today")

    fresh = dist.new_group([0, 1])  # its facts are not cached yet: the agent must look them up
    monkeypatch.setattr(groups, "lane_for", broken)
    monkeypatch.setattr(diagnostics, "_said", set())  # once per API per process: start afresh
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with autoannot.record() as records:
            for _ in range(3):
                t = torch.ones(4)
                dist.all_reduce(t, group=fresh)
                dist.broadcast(t, src=0, group=fresh)
    ours = [str(w.message) for w in caught if "autoannot" in str(w.message)]
    assert len(ours) == 2, ours
    assert "all_reduce" in ours[0] and "LookupError: no facts today" in ours[0]
    assert "broadcast" in ours[1]
    assert len(records) == 0


def test_describe_call_and_annotate_collective_agree_with_the_agent(fake_world, agent) -> None:
    inp, out = torch.ones(10, dtype=torch.bfloat16), torch.empty(20, dtype=torch.bfloat16)
    with autoannot.record() as records:
        dist.all_gather_into_tensor(out, inp)
    described = autoannot.describe_call(dist.all_gather_into_tensor, out, inp)
    assert records[0].annotation == described
    ctx = autoannot.annotate_collective("all_gather_into_tensor", inp, out)
    assert isinstance(ctx, autoannot.AnnotationContext)
    assert ctx.annotation == described
    with autoannot.record() as manual, ctx:
        pass
    assert manual[0].annotation == described and manual[0].param_comms == records[0].param_comms
    assert autoannot.annotate_collective("allreduce", inp, inp).annotation["Collective name"] == (
        "allreduce")
    with pytest.raises(KeyError):
        autoannot.annotate_collective("no_such_collective", inp, inp)


def group_lifetime(rank: int, world: int) -> list[Any]:
    import gc
    import weakref

    from autoannot.describe import groups

    autoannot.enable()
    with autoannot.record():
        dist.all_reduce(torch.ones(2))
    pg = weakref.ref(dist.group.WORLD)
    cached = len(groups._facts)
    dist.destroy_process_group()
    gc.collect()
    return [cached, pg() is None, len(groups._facts)]


def test_the_agent_does_not_keep_destroyed_groups_alive() -> None:
    """A destroyed group is freed (its backend's threads stop) with the agent on, as without
    it: the metadata cache holds groups weakly."""
    (seen,) = run_ranks(group_lifetime, 1)
    assert seen == [1, True, 0]


def test_a_launch_whose_context_cannot_be_entered_is_still_recorded(fake_world, agent) -> None:
    """Entering the annotation fails (torch's mark_kernels, in a capture): the collective runs
    once, as the same launch (nothing below annotates it again), and the open recorders still
    get it."""
    import agent_hooks as hooks

    from autoannot.describe.kinds import Kind
    from autoannot.keep import route

    def unenterable(annotation: dict) -> None:
        raise RuntimeError("no driver")

    calls = []
    kind = Kind("all_reduce", {"name": "all_reduce"}, {"Rank": 0}, (), None)
    with autoannot.record(dispatcher=True) as records, warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        failing = route.Route(hooks.AGENT.state)
        failing.marks = unenterable  # (torch's mark_kernels, failing)
        result = failing.run_whole(kind, None, True, route.one_launch, hooks.AGENT.state,
                                   route.EXCLUDES, lambda t: calls.append(t) or 7,
                                   (torch.ones(1),), {})
        dist.all_reduce(torch.ones(2))
    assert result == 7 and len(calls) == 1
    assert [r.api for r in records] == ["all_reduce", "all_reduce"]
    assert records[0].annotation == {"name": "all_reduce"} and records[0].cpu_only == {"Rank": 0}

"""Programs that turn warnings into errors keep working with the agent on, and what can be
known about any process group is annotated.

Three calls that broke under ``-W error`` (torch's own test suites make them): a collective on
a ``ProcessGroupGloo`` built directly (never registered), on a process group implemented in
Python, and a functional collective on meta tensors (tracing, no launch).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import agent_hooks as hooks
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import autoannot
from autoannot.base import diagnostics
from autoannot.describe import groups
from autoannot.describe import vocabulary as V


class PythonGroup(dist.ProcessGroup):
    """A process group implemented in Python (torch's tests have several): no name is set."""

    def __init__(self) -> None:
        super().__init__(0, 1)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(tensors)
        return torch._C._distributed_c10d._create_work_from_future(future)

    def getBackendName(self) -> str:
        return "python"


def unregistered_gloo() -> Any:
    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1)


CASES: dict[str, Callable[[], Any]] = {
    "unregistered gloo": lambda: dist.all_reduce(torch.ones(3), group=unregistered_gloo()),
    "python group": lambda: dist.all_reduce(torch.ones(4), group=PythonGroup()),
    "meta tensors": lambda: funcol.all_reduce(torch.ones(5, device="meta"), "sum", "0"),
}


def _result(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", value.shape, value.dtype, value.device.type)
    return value


@pytest.fixture
def strict(monkeypatch, caplog) -> Any:
    """Warnings are errors; the agent's once-per-cause memory starts empty."""
    monkeypatch.setattr(diagnostics, "_said", set())
    caplog.set_level(logging.WARNING, logger="autoannot")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield caplog


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("demand", ["recorder", "capture"])
def test_calls_that_broke_under_warnings_as_errors(fake_world, name: str, demand: str,
                                                   strict, monkeypatch) -> None:
    call = CASES[name]
    autoannot.disable()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _result(call())  # what the call returns with the agent off
    autoannot.enable()
    try:
        if demand == "recorder":
            with autoannot.record(dispatcher=True) as records:
                got = _result(call())
            entries = [r.annotation for r in records]
        else:  # a capture in progress (CPU-simulated): the launch goes to the graph's ledger
            monkeypatch.setattr(hooks.AGENT.captures, "identity", hooks.by_thread())
            graph = type("Graph", (), {})()
            hooks.begin_capture(lambda: None, graph, (), {})
            try:
                got = _result(call())
            finally:
                hooks.end_capture(lambda: None, graph, (), {})
            entries = [e["annotation"] for e in hooks.LEDGERS[graph._autoannot_graph].entries]
    finally:
        autoannot.disable()
    assert got == expected  # returned, not raised; nothing lost
    assert strict.records == []  # nothing needed saying
    if name == "meta tensors":
        assert entries == []  # tracing launches nothing
        return
    (annotation,) = entries
    size = 3 if name == "unregistered gloo" else 4
    # What the group object can say; what it cannot (name, ranks) is left out, not invented.
    assert annotation == {
        V.COLLECTIVE_NAME: "allreduce", V.IN_NELEMS: size, V.OUT_NELEMS: size,
        V.GROUP_SIZE: 1, V.DTYPE: "Float", V.IN_SPLIT: "[]", V.OUT_SPLIT: "[]",
        V.NAME: "all_reduce", V.STREAM: annotation[V.STREAM]}


def test_a_group_records_what_it_can_say(fake_world) -> None:
    """The fields and where they come from: registered groups give all; a backend built
    directly gives its size and rank; a Python group gives its size and rank."""
    world = groups.facts_of(dist.group.WORLD)
    assert world.group_keys == {V.PG_NAME: "0", V.PG_DESC: "default_pg", V.PG_RANKS: "[0, 1]"}
    assert world.global_rank_keys == {V.GLOBAL_RANK_START: 0, V.GLOBAL_RANK_STRIDE: 1}
    for group in (unregistered_gloo(), PythonGroup()):
        facts = groups.facts_of(group)
        assert (facts.size, facts.rank, facts.ranks) == (1, 0, None)
        assert facts.group_keys == {} and facts.global_rank_keys == {}


def test_a_failure_is_said_once_through_logging_and_the_result_kept(fake_world, strict,
                                                                     monkeypatch) -> None:
    """Where the metadata cannot be derived, under warnings-as-errors: the collective runs,
    returns its result, and the agent says why once, through the ``autoannot`` logger."""
    def broken(name: str) -> int:
        raise LookupError("no facts today")

    fresh = dist.new_group([0, 1])  # not cached yet: the agent must look its facts up
    monkeypatch.setattr(groups, "lane_for", broken)
    autoannot.enable()
    try:
        with autoannot.record(dispatcher=True) as records:
            works = [dist.all_reduce(torch.ones(2), group=fresh, async_op=True)
                     for _ in range(3)]
    finally:
        autoannot.disable()
    assert all(isinstance(work, dist.Work) for work in works) and records == []
    messages = [r.getMessage() for r in strict.records]
    assert len(messages) == 1 and "LookupError: no facts today" in messages[0]
    assert "all_reduce" in messages[0]


def test_the_same_failure_is_a_warning_where_warnings_are_warnings(fake_world, monkeypatch
                                                                   ) -> None:
    monkeypatch.setattr(diagnostics, "_said", set())
    fresh = dist.new_group([0, 1])
    monkeypatch.setattr(groups, "lane_for", lambda name: 1 / 0)
    autoannot.enable()
    try:
        with warnings.catch_warnings(record=True) as caught, autoannot.record(dispatcher=True):
            warnings.simplefilter("always")
            dist.all_reduce(torch.ones(2), group=fresh)
    finally:
        autoannot.disable()
    ours = [w for w in caught if issubclass(w.category, autoannot.AutoannotWarning)]
    assert len(ours) == 1 and "ZeroDivisionError" in str(ours[0].message)
    assert ours[0].filename == __file__  # attributed to the caller's line


STRICT_INNER = '''
import torch, torch.distributed as dist
import autoannot
from torch.testing._internal.distributed.fake_pg import FakeStore

def test_agent_is_on_and_records(autoannot_records):
    assert autoannot.is_enabled()
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    dist.all_reduce(torch.ones(3))
    dist.group.WORLD.allreduce([torch.ones(4)]).wait()  # C++-origin: the ProcessGroup itself
    assert [r.api for r in autoannot_records] == ["all_reduce", "c10d.allreduce_"]

def test_an_unregistered_group(autoannot_records):
    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
    assert dist.all_reduce(torch.ones(2), group=group) is None
    assert autoannot_records[0].annotation["Group size"] == 1
'''


@pytest.mark.parametrize("how", ["-W error", "filterwarnings = error"])
def test_pytest_with_warnings_as_errors_and_autoannot_1(pytester, monkeypatch, how: str
                                                         ) -> None:
    """``AUTOANNOT=1 python -m pytest -W error``: the start-up hook imported the package that
    pytest would rewrite as the pytest11 plugin's; the suite runs and the plugin works."""
    monkeypatch.setenv("AUTOANNOT", "1")
    pytester.makepyfile(test_inner=STRICT_INNER)
    args = ["-p", "no:cacheprovider", "-q"]
    if how == "-W error":
        args += ["-W", "error"]
    else:
        pytester.makeini("[pytest]\nfilterwarnings =\n    error\n")
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(passed=2)
    assert "PytestAssertRewriteWarning" not in result.stdout.str() + result.stderr.str()

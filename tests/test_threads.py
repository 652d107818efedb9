"""record() sees the launches of every thread, once each."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

import autoannot


def test_records_from_many_threads_exactly_once(fake_world, agent) -> None:
    per_thread, threads = 200, 6
    sizes = {i: 10 + i for i in range(threads)}

    def work(i: int) -> None:
        t = torch.ones(sizes[i])
        for _ in range(per_thread):
            dist.all_reduce(t)

    call_line = work.__code__.co_firstlineno + 3  # the all_reduce's line
    with autoannot.record() as records:
        pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    assert len(records) == threads * per_thread
    counts = {}
    for r in records:
        counts[r.annotation["In msg nelems"]] = counts.get(r.annotation["In msg nelems"], 0) + 1
    assert counts == {n: per_thread for n in sizes.values()}
    assert {r.call_site.rsplit("/", 1)[-1] for r in records} == {f"test_threads.py:{call_line}"}


def _blocked_inside_a_wrapped_call(state, entered: threading.Event,
                                   release: threading.Event) -> threading.Thread:
    """A thread held inside a wrapped call (as in a collective that waits for its peers)."""
    from autoannot.keep import route

    def wait() -> None:
        entered.set()
        release.wait(30)

    thread = threading.Thread(
        target=route.one_launch, args=(state, route.EXCLUDES, wait, (), {}), daemon=True)
    thread.start()
    assert entered.wait(30)
    return thread


def test_a_thread_inside_a_wrapped_call_hides_no_other_threads_launch(fake_world, agent) -> None:
    from autoannot.agent.instrumentation import INSTRUMENTATION

    state = INSTRUMENTATION.state
    entered, release = threading.Event(), threading.Event()
    with autoannot.record() as records:
        thread = _blocked_inside_a_wrapped_call(state, entered, release)
        assert list(state.inside.values()) == [1]  # that thread, one call deep
        dist.all_reduce(torch.ones(3))  # this thread: a launch of its own
        release.set()
        thread.join(30)
    assert [r.annotation["In msg nelems"] for r in records] == [3]
    assert state.inside == {}  # each thread's entry left with its outermost call


def test_a_call_that_raises_leaves_its_thread_outside(fake_world, agent) -> None:
    from autoannot.agent.instrumentation import INSTRUMENTATION

    with autoannot.record() as records:
        with pytest.raises(ValueError):  # (what torch raises for it, as with the agent off)
            dist.all_reduce(torch.ones(2), group="not a group")
        assert INSTRUMENTATION.state.inside == {}
        dist.all_reduce(torch.ones(4))
    assert [r.annotation["In msg nelems"] for r in records] == [4]


def test_a_forked_child_keeps_no_depth_of_its_parents_other_threads(fake_world, agent) -> None:
    import os
    import warnings

    from autoannot.agent.instrumentation import INSTRUMENTATION

    state = INSTRUMENTATION.state
    entered, release = threading.Event(), threading.Event()
    thread = _blocked_inside_a_wrapped_call(state, entered, release)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # (fork with threads alive)
            child = os.fork()
        if child == 0:  # only this thread lives here: a new thread may get the other's ident
            os._exit(0 if state.inside == {} else 1)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert len(state.inside) == 1  # the parent's thread is still inside
    finally:
        release.set()
        thread.join(30)

"""A launch lands in the ledger of the capture it goes into, whatever thread makes it.

CUDA ties streams to captures: a capture begun on a stream gets an id, and every stream joined
to it (an event wait: autograd's streams during a captured backward, a side stream) reports
that id to ``cudaStreamGetCaptureInfo``. ``SimulatedCuda`` keeps that bookkeeping on the CPU
so the agent's real capture code (``capture_identity.ByCaptureId``, the ledgers, the dispatcher
kernels) runs here; the same runs on CUDA in ``tests/gpu/training_patterns.py``.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import agent_hooks as hooks
import pytest
import torch
import torch.distributed as dist

from autoannot.describe import vocabulary as V
from autoannot.keep import capture_identity


class SimulatedCuda:
    """Per thread a current stream; per stream the capture it takes part in, if any."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._ids = itertools.count(1)
        self.capture_of: dict[str, int] = {}
        self.asked = 0  # cudaStreamGetCaptureInfo calls

    def use(self, stream: str) -> None:
        self._local.stream = stream

    def current(self) -> str:
        return getattr(self._local, "stream", "default")

    def begin_capture(self) -> None:  # cudaStreamBeginCapture on the current stream
        self.capture_of[self.current()] = next(self._ids)

    def end_capture(self) -> None:
        capture_id = self.capture_of[self.current()]
        for stream in [s for s, c in self.capture_of.items() if c == capture_id]:
            del self.capture_of[stream]

    def join(self, stream: str, capturing: str) -> None:  # stream.wait_event(on capturing)
        self.capture_of[stream] = self.capture_of[capturing]

    def capture_id(self) -> int | None:  # cudaStreamGetCaptureInfo(current stream)
        self.asked += 1
        return self.capture_of.get(self.current())


class Graph:
    """Stands in for torch.cuda.CUDAGraph: the agent names it and keys its ledger on it."""


@pytest.fixture
def cuda(monkeypatch) -> SimulatedCuda:
    sim = SimulatedCuda()
    monkeypatch.setattr(hooks.AGENT.captures, "identity", hooks.identity(
        capture_identity.ByCaptureId(sim.capture_id, sim.current)))
    return sim


def _begin(sim: SimulatedCuda, graph: Graph) -> None:
    hooks.begin_capture(lambda: sim.begin_capture(), graph, (), {})


def _end(sim: SimulatedCuda, graph: Graph) -> None:
    hooks.end_capture(lambda: sim.end_capture(), graph, (), {})


def _in_thread(fn: Any) -> None:
    """Run ``fn`` on a new thread and wait for it."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and not errors, errors


def _carry_callers_keys() -> None:
    """What autograd's engine does for its device threads: run with the backward caller's
    thread-local dispatch keys (the agent's key included; the real thing runs on CUDA).
    Where torch's process-group hooks observe, the agent has no key."""
    from autoannot.observe import python_layer

    if hooks.AGENT.group_hooks_observe():
        return
    torch._C._dispatch_tls_set_dispatch_key_included(python_layer._key(), True)


def _ledger(graph: Graph) -> list[tuple[str, int]]:
    entries = hooks.ledger(graph).entries
    return [(e["api"], e["annotation"][V.IN_NELEMS]) for e in entries]


class Worker:
    """A thread that runs what it is given, one call at a time, on its own current stream."""

    def __init__(self, cuda: SimulatedCuda, stream: str, carries_callers_keys: bool = False
                 ) -> None:
        import queue

        self._jobs: queue.Queue = queue.Queue()
        self._done: queue.Queue = queue.Queue()

        def loop() -> None:
            cuda.use(stream)
            if carries_callers_keys:
                _carry_callers_keys()
            while (job := self._jobs.get()) is not None:
                try:
                    self._done.put((job(), None))
                except BaseException as exc:
                    self._done.put((None, exc))

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def run(self, job: Any) -> Any:
        self._jobs.put(job)
        result, error = self._done.get(timeout=60)
        if error is not None:
            raise error
        return result

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=60)


def test_two_captures_at_once_on_two_threads_stay_apart(fake_world, agent, cuda) -> None:
    """Capture 1 begins on thread A (stream s1), capture 2 on thread B (stream s2), both in
    progress together. A third thread on a stream joined to capture 1 (autograd's device
    thread in a captured backward) launches through the Python API and from C++ (the
    ProcessGroup itself, as DDP's reducer does); B launches from C++ too; a fourth thread
    launches eagerly on a stream in no capture. Each launch lands in its capture's ledger, in
    launch order; the eager one in none."""
    g1, g2 = Graph(), Graph()
    pg = dist.group.WORLD
    a, b = Worker(cuda, "s1"), Worker(cuda, "s2")
    autograd = Worker(cuda, "autograd", carries_callers_keys=True)
    eager = Worker(cuda, "eager")
    try:
        a.run(lambda: _begin(cuda, g1))
        b.run(lambda: _begin(cuda, g2))
        cuda.join("autograd", "s1")
        a.run(lambda: dist.all_reduce(torch.ones(11)))
        b.run(lambda: dist.all_reduce(torch.ones(21)))
        autograd.run(lambda: pg.allreduce([torch.ones(12)]).wait())
        eager.run(lambda: dist.all_reduce(torch.ones(99)))
        autograd.run(lambda: dist.broadcast(torch.ones(13), 0))
        b.run(lambda: pg.broadcast(torch.ones(22), 0).wait())
        a.run(lambda: _end(cuda, g1))
        b.run(lambda: _end(cuda, g2))
    finally:
        for worker in (a, b, autograd, eager):
            worker.stop()
    assert _ledger(g1) == [("all_reduce", 11), ("c10d.allreduce_", 12), ("broadcast", 13)]
    assert _ledger(g2) == [("all_reduce", 21), ("c10d.broadcast_", 22)]
    assert hooks.AGENT.captures.identity.how.startswith("cuStreamGetCaptureInfo")


def test_a_launch_after_its_capture_ended_lands_nowhere(fake_world, agent, cuda) -> None:
    graph = Graph()
    cuda.use("s1")
    _begin(cuda, graph)
    dist.all_reduce(torch.ones(5))
    _end(cuda, graph)
    other = Graph()
    cuda.use("s9")
    _begin(cuda, other)
    cuda.use("s1")  # s1's capture is over: eager work, though another capture is running
    dist.all_reduce(torch.ones(6))
    cuda.use("s9")
    _end(cuda, other)
    assert _ledger(graph) == [("all_reduce", 5)]
    assert _ledger(other) == []


def test_a_stream_is_asked_about_once_per_capture(fake_world, agent, cuda) -> None:
    """CUDA is asked once per stream and capture (the answer kept while the capture is in
    progress), and asked again once that capture ended: the same stream, captured again,
    lands in the new graph; eager work on it between the two, in none."""
    first, second = Graph(), Graph()
    cuda.use("s1")
    _begin(cuda, first)
    asked = cuda.asked
    for n in range(1, 6):
        dist.all_reduce(torch.ones(n))
    assert cuda.asked - asked == 1
    _end(cuda, first)
    dist.all_reduce(torch.ones(50))  # eager, though the stream was capturing a moment ago
    _begin(cuda, second)
    dist.all_reduce(torch.ones(7))
    _end(cuda, second)
    assert _ledger(first) == [("all_reduce", n) for n in range(1, 6)]
    assert _ledger(second) == [("all_reduce", 7)]


def test_a_stream_that_cannot_be_read_is_in_no_capture(fake_world, agent) -> None:
    """A CUDA build on a machine with no driver: reading the current stream raises. Asking
    which capture a launch goes into answers none (torch's own way to ask does the same),
    and such a launch is recorded as any other."""

    def no_driver() -> int:
        raise RuntimeError("Found no NVIDIA driver on your system")

    way = capture_identity.ByCaptureId(lambda: 1, no_driver)
    assert way.current() is None
    import autoannot

    identity = hooks.identity(way)
    graph = Graph()
    captures = hooks.AGENT.captures
    saved, captures.identity = captures.identity, identity
    try:
        captures.began(graph)
        with autoannot.record() as records:
            dist.all_reduce(torch.ones(8))
        captures.ended(graph)
    finally:
        captures.identity = saved
    assert [r.api for r in records] == ["all_reduce"]
    assert _ledger(graph) == []


def test_without_capture_ids_a_capture_keeps_the_launches_of_its_thread(fake_world, agent,
                                                                          monkeypatch) -> None:
    """Where neither torch nor cuda.bindings can say (the fallback): the capturing thread's
    launches, and only those."""
    monkeypatch.setattr(hooks.AGENT.captures, "identity", hooks.by_thread())
    graph = Graph()
    hooks.begin_capture(lambda: None, graph, (), {})
    dist.all_reduce(torch.ones(3))
    _in_thread(lambda: dist.all_reduce(torch.ones(4)))
    hooks.end_capture(lambda: None, graph, (), {})
    assert _ledger(graph) == [("all_reduce", 3)]
    assert hooks.AGENT.captures.identity.how.startswith("the capturing thread")

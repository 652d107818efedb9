"""The GPU's own times of a ring's launches: when each collective started and ended on the GPU,
on the host's monotonic clock, in a file beside the ring (``rank{R}.ring.gpu``; its layout in
``base/ring_format.py``).

How: a timing event (``torch.cuda.Event(enable_timing=True)``) is recorded on the launching
stream just before a collective and one just after it. The collective cannot start on the GPU
before its stream reaches the first (the collective's own stream waits on the launching one):
its start is when this rank's GPU reached it. The second completes when the launching stream
may go on past it: the collective's end for a call that makes the stream wait on it (every
``async_op=False`` call); a call that returns a Work has no end (the stream does not wait
until the Work is waited on). In a capture the two are external events (captured as
event-record nodes) and are recorded again at each replay of the graph.

Nothing blocks the launching thread and nothing syncs the device: one thread of the rank (the
clock's) looks at the pending events every millisecond (``query``) and writes those that
completed, converted against an anchor: an event it records on an idle stream of its own,
whose host time it reads as it completes (the conversion's error is bounded by that wait,
written in the header; the anchor is made again every ``ANCHOR_EVERY_S``). It also writes, at
each look, the oldest timed launch whose GPU has not started it and when that launch was
entered: what names a GPU that hangs before a collective.

A graph's launches are timed by stamps, not events (an event captured in a graph is one for
all its replays: a replay launched before the clock read the last one's times takes them
away): a one-thread kernel captured before and after each collective writes the GPU's clock
into a slot of host memory of its own for each run (``keep.gpu_stamps``); the clock reads
replay ``k``'s times from run ``k`` of each, converted against a stamp of its own anchor.

``source``: what makes, records and reads events and stamps (``CudaEvents``: torch's events
and ``keep.gpu_stamps``; a test plants its own timeline).
"""

from __future__ import annotations

import collections
import mmap
import os
import threading
import time
from _thread import get_ident
from typing import Any

from autoannot.base import config
from autoannot.base.diagnostics import say_once
from autoannot.base.ring_format import (
    GPU_HEADER,
    GPU_MAGIC,
    GPU_NONE,
    GPU_RECORD,
    GPU_STATE,
    GPU_STATE_AT,
    HEADER_BYTES,
    gpu_bytes,
)

#: How often the clock's thread looks at the pending events (seconds).
LOOK_EVERY_S = 0.001
#: How often the anchor is made again (seconds): the GPU's clock and the host's drift apart.
ANCHOR_EVERY_S = 10.0
#: At most this many eager launches and replays wait to be read; past it, they go untimed
#: (said once).
MOST_PENDING = 1 << 14
#: Captures under way in this process (``keep.captures`` counts them): the clock's thread does
#: not look meanwhile — a CUDA query from another thread while a graph is captured in torch's
#: default (global) mode ends the capture in an error; its thread is also made relaxed where
#: the driver lets it (``CudaEvents.relax_capture_mode``).
CAPTURING = [0]
#: Held by the clock's thread while it looks, and by a capture's beginning while it counts
#: itself (so no look is under way as a capture begins).
LOOKING = threading.Lock()


def capture_coming(journals: tuple = ()) -> None:
    """A capture begins now (before torch begins it): what the journals' clocks need for it
    made (``Ring.gpu_prepare_capture``: the stamps), and no look from here until it is over."""
    for journal in journals:
        prepare = getattr(journal, "gpu_prepare_capture", None)
        if prepare is not None:
            prepare()
    with LOOKING:
        CAPTURING[0] += 1


def capture_ending(journals: tuple = ()) -> None:
    """A capture ends now (before torch ends it): the journals' clocks join what they forked
    in it (``GpuClock.capture_ending``)."""
    for journal in journals:
        clock = getattr(journal, "gpu", None)
        if clock is not None:
            clock.capture_ending()


def capture_over() -> None:
    """A capture ended (or failed to begin)."""
    CAPTURING[0] = max(0, CAPTURING[0] - 1)
#: How long closing waits for the launches still pending on the GPU (seconds).
CLOSE_WAIT_S = 0.5
#: Events kept for reuse.
POOL = 1024
#: Whether a graph's stamps branch off its path (``CudaEvents.point``): a stamp on the path
#: holds the work after it for a kernel's launch (~2 us each on an H100), one on a branch
#: holds nothing but the graph's end.
BRANCHED = True
#: Whether a graph's collectives get a stamp after them too (their GPU end), or before alone
#: (``AUTOANNOT_GPU_GRAPH_ENDS``; read as a clock is made): on an H100, 16 collectives'
#: stamps before and after cost a decode replay of batch 32 3.5%, before alone 0.8%.
GRAPH_ENDS = config.gpu_graph_ends()
#: Whether an eager launch is timed by stamps on a branch of its stream (as a graph's are)
#: rather than by two events on the stream (``AUTOANNOT_GPU_EAGER_STAMPS``, on unless ``0``):
#: events hold the stream's work after them (+3.1-3.2 GPU us a collective on an H100), a
#: branch's stamps do not (+0.04); they cost the launching thread more (+8-35 us a call).
EAGER_STAMPS = config.gpu_eager_stamps()
#: Whether a ring's source is ``DriverEvents`` rather than ``CudaEvents`` where torch sees CUDA
#: (``AUTOANNOT_GPU_DRIVER_EVENTS``).
DRIVER_EVENTS = config.gpu_driver_events()
#: Whether an eager launch's timing events are recorded on a branch of its stream (a stream of
#: the clock's that waits for the launching stream at that point: an event without timing
#: recorded on it, waited on) rather than on the stream itself: a timing event holds the
#: stream's work after it, a plain one less (measured: ``benchmarks/gpu_step_cost.py``).
EAGER_BRANCHED = False
#: Whether an eager launch gets its GPU end too, not its start alone.
EAGER_ENDS = True
#: (An eager launch's ``graph``: it is read from stamps, as a replay's launch.)
EAGER = ""
#: Eager stamps: points used in turn (each run of one counted on the host).
EAGER_POINTS = 1024
#: The stamps of a device: points (one a captured collective, two with its end, for all graphs
#: of the process) and runs kept of each: the clock reads a replay within this many replays of
#: it (at 32, a decode loop of 0.5 ms replays lost up to half a loop's times on the H100 where
#: the clock's thread waited for Python's lock); 8 MiB of pinned host memory (16 bytes a slot).
STAMP_POINTS, STAMP_DEPTH = 4096, 128
#: How long the clock's thread spins for an anchor's stamp as it launches it (ns): on an idle
#: stream it lands in microseconds; where the GPU's queue holds it (a stream of the clock's may
#: share a hardware queue with the job's) or it never lands (a hung GPU), it is looked for once
#: a look after, and its time is known to the looks' spacing; the clock's thread is never held.
STAMP_ANCHOR_SPIN_NS = 2_000_000
#: An anchor's stamp unseen this long is said (once): a graph's collectives wait for it.
STAMP_ANCHOR_SAY_S = 5.0


def on_cuda(args: tuple, kwargs: dict) -> bool:
    """Whether a collective's first tensor argument (or the first of its first list) lies on
    a CUDA device: the launches ``CudaEvents`` times."""
    first = args[0] if args else next(iter(kwargs.values()), None)
    if first.__class__ in (list, tuple):
        first = first[0] if first else None
    return bool(getattr(first, "is_cuda", False))


def said(what: str, exc: BaseException) -> None:
    """A failure of the GPU's times (``what`` failed), said once: the launches go on."""
    say_once(f"gpu clock:{what.split()[0]}", f"autoannot: the GPU's times: {what}: "
             f"{type(exc).__name__}: {exc}; the launches run on, without their GPU times")


class CudaEvents:
    """torch's timing events on the current CUDA device: the clock's real source."""

    #: Which launches it times (by their arguments).
    times = staticmethod(on_cuda)

    def __init__(self) -> None:
        import torch

        self._cuda = torch.cuda
        self._event = torch.cuda.Event
        self._device_now = torch.cuda.current_device
        self._stream_of = torch.cuda.current_stream
        self._side: Any = None
        #: Per capturing thread: the stream its stamps branch off to (none waits on them but
        #: the capture's end: off the graph's path), and whether this capture used it.
        self._branches: dict[int, list[Any]] = {}
        #: The launching thread's device, as the clock is made (a rank's GPU): the clock's
        #: thread makes its anchors there.
        self.device = torch.cuda.current_device()
        #: Per device: the stamps of graphs captured there, and their anchor's point.
        self._stamps: dict[int, Any] = {}
        self._anchor_points: dict[int, int] = {}
        self._anchor_runs: dict[int, int] = {}
        #: Per device: the points eager stamps take in turn, each one's runs so far, the next.
        self._eager: dict[int, list[int]] = {}
        self._eager_runs: dict[int, list[int]] = {}
        self._eager_next: dict[int, int] = {}
        self._eager_lock = threading.Lock()
        #: Per launching thread and stream: its eager stamps' branch (a stream of its own,
        #: kept by torch, as the driver's handle) and the event that makes it wait.
        self._eager_branches: dict[tuple[int, int], tuple[int, int]] = {}
        self._branch_streams: list[Any] = []
        #: Per launching thread and stream: the branch its events are recorded on
        #: (``EAGER_BRANCHED``) and the event that makes it wait for the stream.
        self._event_branches: dict[tuple[int, int], tuple[Any, Any]] = {}

    def new(self, external: bool = False) -> Any:
        if external:
            return self._event(enable_timing=True, external=True)
        return self._event(enable_timing=True)

    def record(self, event: Any, stream: Any = None) -> Any:
        """Recorded on ``stream``, or the current stream (the device named: torch's lookup of
        the current device when none is named costs a launch some 10 us); the stream."""
        if stream is None:
            stream = self._stream_of(self._device_now())
        if EAGER_BRANCHED:
            key = (get_ident(), stream.cuda_stream)
            branch = self._event_branches.get(key)
            if branch is None:
                branch = self._event_branches[key] = (self._cuda.Stream(stream.device),
                                                      self._event())
            branch[1].record(stream)
            branch[0].wait_event(branch[1])
            event.record(branch[0])
            return stream
        event.record(stream)
        return stream

    @staticmethod
    def done(event: Any) -> bool:
        return event.query()

    @staticmethod
    def ms_between(first: Any, second: Any) -> float:
        return first.elapsed_time(second)

    def capturing(self) -> bool:
        return self._cuda.is_current_stream_capturing()

    @staticmethod
    def relax_capture_mode() -> bool:
        """Make this thread (the clock's) one whose CUDA calls never invalidate another
        thread's capture: the driver's ``cuThreadExchangeStreamCaptureMode`` (public, this
        thread alone) set to relaxed. torch captures in global mode by default, where an
        ``cudaEventQuery`` from any other thread while a graph is captured ends the capture
        in an error. Whether it was set."""
        import ctypes

        try:
            driver = ctypes.CDLL("libcuda.so.1")
            mode = ctypes.c_int(2)  # CU_STREAM_CAPTURE_MODE_RELAXED
            return driver.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
        except (OSError, AttributeError):
            return False

    def prepare_capture(self) -> None:
        """(As a capture is about to begin, before torch begins it) the stamps of the current
        device made, where not yet: their module, memory and anchor point are made outside
        any capture."""
        device = self._device_now()
        self._stamps_on(device)
        if BRANCHED and get_ident() not in self._branches:
            self._branches[get_ident()] = [self._cuda.Stream(device), False]

    def _stamps_on(self, device: int) -> Any:
        """The stamps of ``device``, made at the first ask (outside any capture)."""
        stamps = self._stamps.get(device)
        if stamps is None:
            from autoannot.keep.gpu_stamps import Stamps

            stamps = Stamps(points=STAMP_POINTS, depth=STAMP_DEPTH)
            self._anchor_points[device] = stamps.new_point()
            self._eager[device] = [stamps.new_point() for _ in range(EAGER_POINTS)]
            self._eager_runs[device] = [0] * EAGER_POINTS
            self._eager_next[device] = 0
            self._stamps[device] = stamps
        return stamps

    def point(self) -> Any:
        """(In a capture) a stamp captured where the current stream is: on a branch of the
        graph that waits for the stream's work so far and that nothing waits for until the
        capture's end (``BRANCHED``), else on the stream itself. Its point on its device's
        stamps; None where the device has none (``prepare_capture`` failed)."""
        device = self._device_now()
        stamps = self._stamps.get(device)
        if stamps is None:
            return None
        here = self._stream_of(device)
        branch = self._branches.get(get_ident())
        if branch is None:
            return (stamps, stamps.stamp(here.cuda_stream))
        branch[0].wait_stream(here)
        branch[1] = True
        return (stamps, stamps.stamp(branch[0].cuda_stream))

    def eager_stamp(self, stream: Any = None) -> tuple[Any, int, Any]:
        """(An eager launch) a stamp on a branch of ``stream`` (the current stream where None)
        that waits for its work so far (a branch a launching thread and stream): the point,
        its run and the stream. Nothing waits on the branch: the stream's work after it is
        not held."""
        device = self._device_now()
        stamps = self._stamps_on(device)
        if stream is None:
            stream = self._stream_of(device)
        handle = stream.cuda_stream
        key = (get_ident(), handle)
        branch = self._eager_branches.get(key)
        if branch is None:
            side = self._cuda.Stream(device)
            self._branch_streams.append(side)  # (kept: its handle is used)
            branch = self._eager_branches[key] = (side.cuda_stream, stamps.new_fork())
        runs = self._eager_runs[device]
        with self._eager_lock:  # (launching threads take points in turn)
            at = self._eager_next[device]
            self._eager_next[device] = (at + 1) % EAGER_POINTS
            run = runs[at]
            runs[at] = run + 1
        point = self._eager[device][at]
        stamps.launch_after(point, handle, branch[0], branch[1])
        return (stamps, point), run, stream

    def capture_ending(self) -> None:
        """(This thread's capture ends now, before torch ends it) its branch joined to the
        current stream, where its stamps used it: a capture ends only with every stream it
        forked joined."""
        branch = self._branches.get(get_ident())
        if branch is not None and branch[1]:
            branch[1] = False
            self._stream_of(self._device_now()).wait_stream(branch[0])

    @staticmethod
    def stamp_ns(point: Any, run: int) -> int:
        """The GPU's clock (ns) at run ``run`` of ``point``: 0 not yet, -1 lost (written over:
        the reader fell ``STAMP_DEPTH`` runs behind)."""
        stamps, at = point
        return stamps.time(at, run)

    def launch_anchor(self) -> tuple[Any, int] | None:
        """(The clock's thread) a stamp launched now on the clock's idle stream: what
        ``anchor_ns`` reads; None where no stamps were made."""
        if not self._stamps:
            return None
        device = next(iter(self._stamps))
        stamps, point = self._stamps[device], self._anchor_points[device]
        with self._cuda.device(device):
            if self._side is None:
                self._side = self._cuda.Stream()
            run = self._anchor_runs.get(device, 0)  # (launched by this thread alone)
            self._anchor_runs[device] = run + 1
            stamps.launch(point, self._side.cuda_stream)
        return (stamps, point), run

    @staticmethod
    def anchor_ns(anchor: tuple[Any, int]) -> int:
        """The GPU's time of a stamp of ``launch_anchor`` (0: not yet)."""
        (stamps, point), run = anchor
        return stamps.time(point, run)

    def anchor(self) -> Any:
        """An event recorded now on an idle stream of the clock's own (on the rank's device)."""
        with self._cuda.device(self.device):
            if self._side is None:
                self._side = self._cuda.Stream()
            event = self._event(enable_timing=True)
            event.record(self._side)
        return event


class DriverEvents(CudaEvents):
    """``CudaEvents`` whose timing events are the CUDA driver's own, made, recorded, asked and
    read through its public API (``cuEventCreate``, ``cuEventRecord``, ``cuEventQuery``,
    ``cuEventElapsedTime``; ctypes, Python's lock held: each call is microseconds) — the same
    events torch's ``Event`` wraps, without torch's Python and C++ around each call; streams
    and stamps are torch's and ``CudaEvents``'. An event is the driver's handle (an int).
    (``EAGER_BRANCHED`` is torch's events' alone.)"""

    def __init__(self) -> None:
        import ctypes

        from autoannot.keep.gpu_stamps import held_driver

        super().__init__()
        driver = held_driver()
        self._driver, self._ctypes = driver, ctypes
        self._record_event, self._query = driver.cuEventRecord, driver.cuEventQuery
        self._ms = ctypes.c_float()
        #: The launching thread's CUDA context (torch's): made current on the clock's thread
        #: (the driver's calls there failed with no context: CUresult 201, on an H100).
        self._context = ctypes.c_void_p()
        driver.cuCtxGetCurrent(ctypes.byref(self._context))

    def _made(self, flags: int) -> int:
        event = self._ctypes.c_void_p()
        code = self._driver.cuEventCreate(self._ctypes.byref(event), flags)
        if code:
            raise RuntimeError(f"cuEventCreate failed: CUresult {code}")
        return event.value

    def new(self, external: bool = False) -> Any:
        return self._made(0)  # (CU_EVENT_DEFAULT: timed)

    def free(self, event: Any) -> None:
        self._driver.cuEventDestroy_v2(event)

    def record(self, event: Any, stream: Any = None) -> Any:
        if stream is None:
            stream = self._stream_of(self._device_now())
        code = self._record_event(event, stream.cuda_stream)
        if code:
            raise RuntimeError(f"cuEventRecord failed: CUresult {code}")
        return stream

    def done(self, event: Any) -> bool:
        code = self._query(event)
        if code == 600:  # (CUDA_ERROR_NOT_READY)
            return False
        if code:
            raise RuntimeError(f"cuEventQuery failed: CUresult {code}")
        return True

    def ms_between(self, first: Any, second: Any) -> float:
        code = self._driver.cuEventElapsedTime(self._ctypes.byref(self._ms), first, second)
        if code:  # (600: not ready, as torch's: the launch stays pending)
            raise RuntimeError(f"cuEventElapsedTime failed: CUresult {code}")
        return self._ms.value

    def anchor(self) -> Any:
        if self._context.value:  # (the clock's thread: the driver's calls need a context)
            self._driver.cuCtxSetCurrent(self._context)
        with self._cuda.device(self.device):
            if self._side is None:
                self._side = self._cuda.Stream()
            event = self._made(0)
            code = self._record_event(event, self._side.cuda_stream)
            if code:
                raise RuntimeError(f"cuEventRecord failed: CUresult {code}")
        if self._last_anchor is not None:
            self.free(self._last_anchor)
        self._last_anchor = event
        return event

    _last_anchor: Any = None


class CudaIfAny:
    """The source a ring is given as it opens at start-up, before torch is imported (so before
    anyone can say whether torch sees a GPU): at its first launch it asks — torch is imported
    then — and makes the ring's source ``CudaEvents`` where torch sees a CUDA device, else
    none (the ring's launches then take the untimed route: ``rerouted``, the agent's
    ``State.rerouted``)."""

    def __init__(self, ring: Any, rerouted: Any) -> None:
        self.ring, self.rerouted = ring, rerouted

    def times(self, args: tuple, kwargs: dict) -> bool:
        return self.decide() and on_cuda(args, kwargs)

    def decide(self) -> bool:
        """Whether torch sees a GPU: the ring's source made so."""
        import sys

        torch = sys.modules.get("torch")
        try:
            sees = bool(torch is not None and torch.cuda.is_available())
        except Exception:  # (a CUDA build with a broken driver: no GPU times)
            sees = False
        if self.ring.gpu_source is self:
            self.ring.gpu_source = ((DriverEvents if DRIVER_EVENTS else CudaEvents) if sees
                                    else None)
            self.rerouted()
        return sees


class _Pending:
    """An eager launch whose GPU times are to be read: its ring index, when it was entered,
    its two events (``end`` None: no end to be had) — or, stamped (``graph`` ``EAGER``), its
    two stamps' points and their runs (``replay``, ``end_run``). (A replay is a ``_Replay``.)"""

    __slots__ = ("end", "end_run", "entered_ns", "graph", "index", "replay", "start",
                 "started_ns", "stream")

    def __init__(self, index: int, entered_ns: int, start: Any, end: Any,
                 graph: str | None = None, replay: int = -1) -> None:
        self.index, self.entered_ns, self.start, self.end = index, entered_ns, start, end
        self.graph, self.replay, self.end_run = graph, replay, replay
        self.started_ns = 0
        self.stream: Any = None  # (an eager launch's: where its events are recorded)


class _Replay:
    """A replay whose launches' GPU times are to be read from their stamps: its graph's
    captured launches (``captured``: each a ``Captured``), their first ring index, when the
    replay was called, its number (its stamps' run); ``next``: the first launch whose start is
    not read yet; ``open_ends``: launches whose start is read and end is not yet (with the
    start's host time)."""

    __slots__ = ("captured", "entered_ns", "first_index", "next", "open_ends", "replay")

    graph = "replay"  # (read from stamps: as ``_Pending.graph``, never None)

    def __init__(self, captured: list, first_index: int, entered_ns: int, replay: int) -> None:
        self.captured, self.first_index, self.entered_ns = captured, first_index, entered_ns
        self.replay, self.next = replay, 0
        self.open_ends: list[tuple[int, int]] = []


class _Waits:
    """What a look found the GPU has not started: its ring index, when it was entered."""

    __slots__ = ("entered_ns", "index")

    def __init__(self, index: int, entered_ns: int) -> None:
        self.index, self.entered_ns = index, entered_ns


#: (A replay read but for ends still to come: ``GpuClock._replay_read``.)
OPEN = _Waits(GPU_NONE, 0)


class Captured:
    """A launch in a capture: its start's stamp point (None: untimed) and its end's (None:
    none), captured as the graph's nodes."""

    __slots__ = ("end", "start")

    def __init__(self, start: Any) -> None:
        self.start, self.end = start, None


class GpuClock:
    """The GPU times of one ring's launches (``path``: its GPU file, made anew; ``capacity``:
    the ring's), read by a thread of its own (started at the first timed launch)."""

    def __init__(self, path: str, capacity: int, source: Any,
                 look_every: float | None = None, thread: bool = True) -> None:
        self.path, self.capacity, self.source = path, capacity, source
        self.look_every = LOOK_EVERY_S if look_every is None else look_every
        self.graph_ends = GRAPH_ENDS
        self.eager_stamps = EAGER_STAMPS and hasattr(source, "eager_stamp")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            os.ftruncate(fd, gpu_bytes(capacity))
            self._map = mmap.mmap(fd, gpu_bytes(capacity))
        finally:
            os.close(fd)
        GPU_HEADER.pack_into(self._map, 0, GPU_MAGIC, GPU_RECORD.size, capacity)
        GPU_STATE.pack_into(self._map, GPU_STATE_AT, 0, GPU_NONE, 0, 0)
        self._lock = threading.Lock()
        self._pending: collections.deque[_Pending] = collections.deque()
        self._pool: list[Any] = []
        self._capturing: dict[int, list[Captured]] = {}
        self._graphs: dict[str, list[Captured]] = {}
        #: Per graph: how many replays were called (a replay's number: its stamps' run).
        self._replay_numbers: dict[str, int] = {}
        self._anchor: tuple[Any, int] | None = None
        #: The stamps' GPU clock less the host's (ns), None before their first anchor.
        self._stamp_offset: int | None = None
        #: An anchor stamp launched, not seen yet: [what the source reads, when it was last
        #: seen missing (ns), when it was launched (ns)].
        self._stamp_anchor: list[Any] | None = None
        self._anchored_at = 0.0
        #: Its thread (``thread`` False: none is started; the caller looks, as a test does).
        self._thread: Any = None if thread else False
        self._stopped = threading.Event()
        self.dropped = 0

    # the launching threads ------------------------------------------------------------------

    def started(self, index: int) -> Any:
        """The launch at ring index ``index`` is about to be issued on the current stream: its
        start event recorded there. What to hand ``ended``."""
        source = self.source
        if source.capturing():  # (a stamp captured: each replay's time its own)
            point = source.point()
            captured = Captured(point)
            self._capturing.setdefault(get_ident(), []).append(captured)
            return captured
        if self.eager_stamps:  # (a stamp on a branch of the stream: ``EAGER_STAMPS``)
            try:
                point, run, stream = source.eager_stamp()
            except Exception as exc:  # (no stamps here: events from now on, said once)
                self.eager_stamps = False
                say_once("gpu clock:eager stamps", "autoannot: the GPU's times: eager stamps "
                         f"failed: {type(exc).__name__}: {exc}; eager launches are timed by "
                         "events instead")
            else:
                pending = _Pending(index, time.monotonic_ns(), point, None, EAGER, run)
                pending.stream = stream
                return pending
        start = self._pool.pop() if self._pool else source.new()
        pending = _Pending(index, time.monotonic_ns(), start, None)
        pending.stream = source.record(start)  # (its end's too: looked up once)
        return pending

    def ended(self, started: Any, waits: bool) -> None:
        """The launch ``started`` returned; ``waits``: the launching stream waits for the
        collective (its end is to be had)."""
        source = self.source
        if started.__class__ is Captured:
            if waits and started.start is not None and self.graph_ends:
                started.end = source.point()
            return
        if not EAGER_ENDS:
            waits = False
        if waits and started.graph is EAGER:
            started.end, started.end_run, _ = source.eager_stamp(started.stream)
        elif waits:
            started.end = self._pool.pop() if self._pool else source.new()
            source.record(started.end, started.stream)
        self._push([started])

    def failed(self, started: Any) -> None:
        """The launch ``started`` raised: its event let go."""
        if started.__class__ is _Pending:
            self._release(started)

    def capture_ended(self, graph: str) -> None:
        """This thread's capture ended as the graph ``graph`` (its ledger's name): its
        launches' events, in capture order, are that graph's."""
        captured = self._capturing.pop(get_ident(), None)
        if captured:
            self._graphs[graph] = captured

    def capture_ending(self) -> None:
        """This thread's capture ends now: what its stamps forked joined (failures said)."""
        ending = getattr(self.source, "capture_ending", None)
        if ending is not None:
            try:
                ending()
            except Exception as exc:
                said("a capture's end", exc)

    def prepare_capture(self) -> None:
        """A capture is about to begin on this thread: what its stamps need made now."""
        prepare = getattr(self.source, "prepare_capture", None)
        if prepare is not None:
            try:
                prepare()
            except Exception as exc:  # (its graphs go untimed; the capture goes on)
                said("stamps for graphs", exc)

    def replayed(self, graph: str, first_index: int, count: int, entered_ns: int) -> None:
        """A replay of ``graph`` called at ``entered_ns`` was written to the ring as its
        launches ``first_index`` .. ``first_index + count - 1``: their GPU times to be read."""
        captured = self._graphs.get(graph)
        if captured is None:
            return
        if len(captured) != count:
            said(f"graph {graph}", ValueError(
                f"{len(captured)} timed launches captured, {count} in its ledger"))
            self._graphs.pop(graph, None)
            return
        with self._lock:
            number = self._replay_numbers.get(graph, 0)
            self._replay_numbers[graph] = number + 1
        self._push([_Replay(captured, first_index, entered_ns, number)])

    def _push(self, items: list[_Pending]) -> None:
        with self._lock:
            if len(self._pending) + len(items) > MOST_PENDING:
                self.dropped += len(items)
                for item in items:
                    self._release(item)
                said("waiting launches", RuntimeError(
                    f"over {MOST_PENDING} launches wait for their GPU"))
                return
            self._pending.extend(items)
        if self._thread is None:
            self._start_thread()

    def _release(self, item: _Pending) -> None:
        if item.graph is not None:
            return
        for event in (item.start, item.end):
            if event is None:
                continue
            if len(self._pool) < POOL:
                self._pool.append(event)
            else:
                free = getattr(self.source, "free", None)
                if free is not None:  # (a driver's handle: let go by hand)
                    free(event)

    # the clock's thread ---------------------------------------------------------------------

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None:  # (started, or none wanted)
                return
            self._thread = threading.Thread(target=self._run, name="autoannot-gpu-clock",
                                            daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            relax = getattr(self.source, "relax_capture_mode", None)
            if relax is not None:
                relax()
            while not self._stopped.is_set():
                with LOOKING:
                    if not CAPTURING[0]:  # (none while a capture is under way: CAPTURING)
                        self.look()
                time.sleep(self.look_every)
        except Exception as exc:  # (the job goes on: its GPU times stop, said once)
            said("its thread", exc)

    def anchor(self, now: float | None = None) -> None:
        """(The clock's thread) an event whose host time is known, made again every
        ``ANCHOR_EVERY_S``; the same for the stamps, once they are made: a stamp launched on
        the clock's stream, its time looked for until it lands (``_stamp_look``)."""
        now = time.monotonic() if now is None else now
        fresh = self._anchor is None or now - self._anchored_at >= ANCHOR_EVERY_S
        if not fresh and self._stamp_offset is not None and self._stamp_anchor is None:
            return
        source = self.source
        error = self._state(0)[3]
        if fresh:
            before = time.monotonic_ns()
            event = source.anchor()
            while not source.done(event):
                pass  # (an idle stream: microseconds)
            after = time.monotonic_ns()
            self._anchor, self._anchored_at = (event, after), now
            error = after - before
        if self._stamp_anchor is None and (fresh or self._stamp_offset is None):
            launch = getattr(source, "launch_anchor", None)
            before = time.monotonic_ns()
            launched = launch() if launch is not None else None
            if launched is not None:
                self._stamp_anchor = [launched, before, before]
                error = self._stamp_look(error, STAMP_ANCHOR_SPIN_NS)
        elif self._stamp_anchor is not None:
            error = self._stamp_look(error, 0)
        GPU_STATE.pack_into(self._map, GPU_STATE_AT, *self._state(error))

    def _stamp_look(self, error: int, spin_ns: int) -> int:
        """(The clock's thread) the anchor stamp looked for, for ``spin_ns`` at most (once at
        least): where it has landed, the stamps' offset from it — its GPU time less the host's
        time it was seen at, right within the time since it was last seen missing (the
        error, with ``error``'s); where not, when it was last missing, kept."""
        pending = self._stamp_anchor
        launched, missing_ns, launched_ns = pending  # type: ignore[misc]
        read = self.source.anchor_ns
        deadline = time.monotonic_ns() + spin_ns
        while True:
            asked_ns = time.monotonic_ns()
            gpu_ns = read(launched)
            seen_ns = time.monotonic_ns()
            if gpu_ns > 0:
                self._stamp_offset, self._stamp_anchor = gpu_ns - seen_ns, None
                return max(error, seen_ns - missing_ns)
            if gpu_ns < 0:  # (its slot written over: launched again at the next anchor)
                self._stamp_anchor = None
                return error
            missing_ns = asked_ns
            if seen_ns >= deadline:
                break
            if seen_ns - launched_ns > 100_000:
                time.sleep(0)  # (past 100 us: Python's lock let go between asks)
        pending[1] = missing_ns  # type: ignore[index]
        if (missing_ns - launched_ns) / 1e9 > STAMP_ANCHOR_SAY_S:
            said("an anchor stamp", TimeoutError(
                f"its time not seen in {STAMP_ANCHOR_SAY_S:g} s (held in the GPU's queue, or the "
                "GPU is hung); a graph's collectives wait for their GPU times until it is"))
        return error

    def _state(self, error_ns: int) -> tuple[int, int, int, int]:
        looked, waiting, since, _ = GPU_STATE.unpack_from(self._map, GPU_STATE_AT)
        return looked, waiting, since, error_ns

    def host_ns(self, event: Any) -> int:
        """A completed event's time on the host's monotonic clock."""
        anchor, at = self._anchor  # type: ignore[misc]
        return at + round(self.source.ms_between(anchor, event) * 1e6)

    def look(self) -> None:
        """(The clock's thread) one look: the completed events written, the state said.

        Launches complete in their order on a stream: the look goes through the pending ones
        oldest first and stops at the first whose GPU has not started it (the one the state
        names), past those under way — a look costs the launches it finds done, not all that
        wait. A launch's end is asked first: where it is done, so is its start (one stream)."""
        self.anchor()
        done = self.source.done
        with self._lock:
            items = list(self._pending)
        finished: set[int] = set()
        waiting: Any = None  # (a _Pending, or a _Waits)
        for item in items:
            if item.__class__ is _Replay:
                stopped = self._replay_read(item)
                if stopped is None:
                    finished.add(id(item))
                    continue
                if stopped is OPEN:
                    continue
                waiting = stopped
                break
            if item.graph is not None:
                if self._stamped(item, finished):
                    continue
                waiting = item
                break
            end = item.end
            ended_done = end is not None and done(end)
            if not item.started_ns:
                at = self._time_of(item.start) if ended_done or done(item.start) else None
                if at is None:
                    waiting = item
                    break
                item.started_ns = at
                self._write(item.index, at, 0)
            if end is None:
                finished.add(id(item))
                continue
            at = self._time_of(end) if ended_done else None
            if at is None:
                continue
            self._write(item.index, item.started_ns, at)
            finished.add(id(item))
        if finished:
            with self._lock:
                kept = collections.deque(i for i in self._pending if id(i) not in finished)
                for item in self._pending:
                    if id(item) in finished:
                        self._release(item)
                self._pending = kept
        _, _, _, error = GPU_STATE.unpack_from(self._map, GPU_STATE_AT)
        GPU_STATE.pack_into(self._map, GPU_STATE_AT, time.monotonic_ns(),
                            GPU_NONE if waiting is None else waiting.index,
                            0 if waiting is None else waiting.entered_ns, error)

    def _time_of(self, event: Any) -> int | None:
        """A completed event's host time; None where torch cannot read it yet (an event
        recorded again between its ``query`` and its read: not expected of an eager launch's,
        recorded once; left pending, as the look before it was)."""
        try:
            return self.host_ns(event)
        except RuntimeError:  # (recorded again since it read done: pending)
            return None

    def _replay_read(self, item: _Replay) -> Any:
        """(A replay) its launches' stamps read, in their order, from where the last look
        stopped: None where every one is read (or lost, or untimed); a ``_Waits`` naming the
        first the GPU has not started; ``OPEN`` where only ends are still to come."""
        offset = self._stamp_offset
        if offset is None:
            return _Waits(item.first_index + item.next, item.entered_ns)
        stamp_ns, run, write = self.source.stamp_ns, item.replay, self._write
        captured, count = item.captured, len(item.captured)
        stopped = None
        while item.next < count:
            launch = captured[item.next]
            if launch.start is not None:
                at = stamp_ns(launch.start, run)
                if at == 0:
                    stopped = _Waits(item.first_index + item.next, item.entered_ns)
                    break
                if at > 0:  # (-1: written over, the reader fell behind: lost)
                    write(item.first_index + item.next, at - offset, 0)
                    if launch.end is not None:
                        item.open_ends.append((item.next, at - offset))
            item.next += 1
        if item.open_ends:
            still = []
            for position, started_ns in item.open_ends:
                at = stamp_ns(captured[position].end, run)
                if at > 0:
                    write(item.first_index + position, started_ns, at - offset)
                elif at == 0:
                    still.append((position, started_ns))
            item.open_ends = still
        if stopped is not None:
            return stopped
        return OPEN if item.open_ends else None

    def _stamped(self, item: _Pending, finished: set[int]) -> bool:
        """(An eager launch stamped) its stamps read: whether its GPU started
        it (its start written; where its end is read too, or lost, or there is none, it is
        ``finished``)."""
        offset = self._stamp_offset
        if offset is None:
            return False
        stamp_ns = self.source.stamp_ns
        if not item.started_ns:
            at = stamp_ns(item.start, item.replay)
            if at == 0:
                return False
            if at < 0:  # (written over: the reader fell behind)
                finished.add(id(item))
                return True
            item.started_ns = at - offset
            self._write(item.index, item.started_ns, 0)
        if item.end is None:
            finished.add(id(item))
            return True
        at = stamp_ns(item.end, item.end_run)
        if at:
            if at > 0:
                self._write(item.index, item.started_ns, at - offset)
            finished.add(id(item))
        return True

    def _write(self, index: int, start_ns: int, end_ns: int) -> None:
        GPU_RECORD.pack_into(self._map, HEADER_BYTES + (index % self.capacity) * GPU_RECORD.size,
                             index, start_ns, end_ns)

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop the thread and unmap the file, after the launches still pending are read
        (``wait_s`` at most: a GPU that hangs does not hold the process's end)."""
        self._stopped.set()
        thread = self._thread
        if thread and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        try:
            deadline = time.monotonic() + wait_s
            while self._pending and time.monotonic() < deadline:
                with LOOKING:
                    if not CAPTURING[0]:
                        self.look()
                if self._pending:
                    time.sleep(self.look_every)
        except Exception:  # (the last looks are a courtesy)
            pass
        self._map.flush()
        self._map.close()

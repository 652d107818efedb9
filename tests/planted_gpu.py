"""A planted GPU for the GPU clock (``keep/gpu_clock.py``) on a machine with none: its events
and one stream, on a GPU clock that reads ``OFFSET_NS`` more than the host's monotonic clock,
with a known delay put on the stream where a test says (``sleep``, as ``torch.cuda._sleep``
does on a real stream). An event recorded on the stream completes when the stream reaches it:
at the host time it was recorded, or later where the stream is held. It stands in for
``gpu_clock.CudaEvents`` (the same methods) where the truth is to be known exactly; the real
events run in tests/gpu/gpu_times.py."""

from __future__ import annotations

import time
from typing import Any

#: The planted GPU clock reads this much more than the host's (a conversion must undo it).
OFFSET_NS = 123_456_789_000


class Event:
    """A planted event: its GPU time once recorded (None: never recorded)."""

    __slots__ = ("external", "gpu_ns")

    def __init__(self, external: bool = False) -> None:
        self.external, self.gpu_ns = external, None


class Point:
    """A planted stamp captured in a graph: the GPU time of each of its runs (one a replay)."""

    __slots__ = ("runs",)

    def __init__(self) -> None:
        self.runs: list[int] = []


class PlantedGpu:
    """One stream of a planted GPU. ``times_all``: it times every launch (the CPU tensors of
    a gloo job stand for a GPU's)."""

    def __init__(self, times_all: bool = True) -> None:
        self.stream_ns = 0  # (GPU clock) where the stream's work so far ends
        self.times_all = times_all
        self.capture: list[Point] | None = None  # stamps captured in a planted capture
        self.depth = 32  # (runs a point keeps)
        #: A collective's coupling across ranks: a tensor the job all-reduces (MAX) holding
        #: each rank's stream time as it called it; an end event recorded after it completes
        #: no earlier than the latest rank's start (as a real collective ends).
        self.payload: Any = None
        self._records = 0
        #: Whether each launch records an end after its start (a launch issued below the
        #: Python API records its start alone).
        self.ends = True
        #: How long an anchor stamp is held before it lands (ms); how many read as lost.
        self.anchor_held_ms = 0.0
        self.anchors_lost = 0

    def times(self, args: tuple, kwargs: dict) -> bool:
        return self.times_all

    @staticmethod
    def gpu_now() -> int:
        return time.monotonic_ns() + OFFSET_NS

    def sleep(self, ms: float) -> None:
        """The stream held ``ms`` past what it has (its host goes on at once)."""
        self.stream_ns = max(self.stream_ns, self.gpu_now()) + int(ms * 1e6)

    def new(self, external: bool = False) -> Event:
        return Event(external)

    def record(self, event: Event, stream: Any = None) -> Any:
        assert self.capture is None, "events are not recorded in a capture (stamps are)"
        self._records += 1
        if self.ends and self._records % 2 == 0 and self.payload is not None:  # (an end:
            self.stream_ns = max(self.stream_ns, int(self.payload[0]))  # after the last start)
        self.stream_ns = max(self.stream_ns, self.gpu_now())
        event.gpu_ns = self.stream_ns

    def called(self) -> int:
        """The stream's time as a collective is called now (what its payload carries)."""
        return max(self.stream_ns, self.gpu_now())

    def replay(self, captured: list[Point], sleeps: dict[int, float]) -> None:
        """A replay of a planted capture: each of its stamps runs once more, in order,
        ``sleeps`` (stamp position -> ms) holding the stream before some."""
        for i, point in enumerate(captured):
            if i in sleeps:
                self.sleep(sleeps[i])
            self.stream_ns = max(self.stream_ns, self.gpu_now())
            point.runs.append(self.stream_ns)

    # stamps (a graph's launches; an eager one's where asked) ----------------------------------

    def eager_stamp(self, stream: Any = None) -> tuple[Point, int, Any]:
        """An eager launch's stamp: where the stream is, as an event recorded there would be."""
        event = Event()
        self.record(event)
        point = Point()
        point.runs.append(event.gpu_ns)
        return point, 0, stream

    def point(self) -> Point:
        assert self.capture is not None
        self.capture.append(point := Point())
        return point

    def stamp_ns(self, point: Point, run: int) -> int:
        if len(point.runs) - run > self.depth:
            return -1
        if run >= len(point.runs) or point.runs[run] > self.gpu_now():
            return 0
        return point.runs[run]

    def launch_anchor(self) -> list[int]:
        """An anchor stamp on the clock's stream: it lands ``anchor_held_ms`` later (a GPU whose
        queue holds the clock's stream behind the job's work), at once where 0."""
        return [self.gpu_now() + int(self.anchor_held_ms * 1e6)]

    def anchor_ns(self, anchor: list[int]) -> int:
        if self.anchors_lost:  # (its slot written over before it was read)
            self.anchors_lost -= 1
            return -1
        return anchor[0] if anchor[0] <= self.gpu_now() else 0

    def done(self, event: Event) -> bool:
        return event.gpu_ns is None or event.gpu_ns <= self.gpu_now()

    @staticmethod
    def ms_between(first: Event, second: Event) -> float:
        assert first.gpu_ns is not None and second.gpu_ns is not None
        return (second.gpu_ns - first.gpu_ns) / 1e6

    def capturing(self) -> bool:
        return self.capture is not None

    def anchor(self) -> Event:
        event = Event()
        event.gpu_ns = self.gpu_now()
        return event


def plant(ring: Any, gpu: PlantedGpu) -> None:
    """The ring times its launches on the planted GPU (as the agent does on a real one)."""
    ring.gpu_source = gpu

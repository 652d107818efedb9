"""Which CUDA-graph capture in progress a launch goes into: the one the launching thread's
current stream takes part in (see ``CaptureIdentity``)."""

from __future__ import annotations

import _thread
import functools
from collections.abc import Callable
from typing import Any

from autoannot.base import locks
from autoannot.keep.ledgers import Ledger


class _Lock:
    def __init__(self) -> None:
        self.lock = locks.renewed(self, "lock")


_LOCK = _Lock()  # (renewed in a forked child)


class Capturing(_thread._local):
    """Per thread: the ledgers of the captures this thread began and has not ended."""

    def __init__(self) -> None:
        self.stack: list[Ledger] = []


class _ByStream:
    """A CUDA way to ask: the answer is kept per stream while its capture is in progress (a
    stream takes part in one capture at a time, until that capture ends), so a launch pays
    for reading the current stream, not for asking CUDA again."""

    def __init__(self, stream: Callable[[], Any] | None = None) -> None:
        self.stream = stream or _current_raw_stream()  # () -> the current stream's handle
        self._streams: dict[Any, Ledger] = {}

    def began(self, ledger: Ledger) -> None:
        pass

    def ended(self, ledger: Ledger) -> None:
        with _LOCK.lock:
            ledger.capturing = False
            for stream in [s for s, kept in self._streams.items() if kept is ledger]:
                del self._streams[stream]

    def current(self) -> Ledger | None:
        try:
            stream = self.stream()
        except Exception:  # no current stream to read (a CUDA build with no driver)
            return None
        ledger = self._streams.get(stream)
        if ledger is None:
            ledger = self.ask(stream)
            if ledger is not None and stream is not None:
                with _LOCK.lock:
                    if ledger.capturing:  # not ended meanwhile (see ended())
                        self._streams[stream] = ledger
        return ledger

    def ask(self, stream: Any) -> Ledger | None:
        raise NotImplementedError


class ByCapturingGraph(_ByStream):
    """torch's ``CUDAGraph.get_currently_capturing_graph()``: it asks CUDA for the current
    stream's capture id and returns the graph being captured under it."""

    how = "torch's get_currently_capturing_graph (CUDA capture id)"

    def __init__(self, ledgers: Any, stream: Callable[[], Any] | None = None) -> None:
        super().__init__(stream)
        self.ledgers = ledgers  # ``Ledgers``: a graph's ledger by the name given to it

    @staticmethod
    def usable() -> bool:
        import torch

        graph_class = getattr(torch._C, "_CUDAGraph", None)
        return callable(getattr(graph_class, "get_currently_capturing_graph", None))

    def ask(self, stream: Any) -> Ledger | None:
        import torch

        try:
            graph = torch._C._CUDAGraph.get_currently_capturing_graph()
        except Exception:  # the current stream is not capturing
            return None
        name = getattr(graph, "_autoannot_graph", None)
        return self.ledgers.get(name) if name is not None else None


class ByCaptureId(_ByStream):
    """The CUDA driver's ``cuStreamGetCaptureInfo`` for the current stream: each capture's id
    is noted when it begins, on the capturing stream. (The driver, not a runtime: a second
    CUDA runtime, such as cuda.bindings', keeps its own current device and can make another
    device's context current on the thread — measured: an empty graph on rank 1.)

    ``capture_id``/``stream``: () -> the current stream's capture id (None: not capturing) and
    handle, for a CUDA simulated in tests."""

    how = "cuStreamGetCaptureInfo (CUDA capture id, from the driver)"

    def __init__(self, capture_id: Callable[[], Any] | None = None,
                 stream: Callable[[], Any] | None = None) -> None:
        if capture_id is None:
            super().__init__(stream)
            self._capture_id_of: Callable[[Any], Any] = _cuda_capture_id
        else:
            super().__init__(stream or (lambda: None))
            self._capture_id_of = lambda stream: capture_id()
        self._ledgers: dict[Any, Ledger] = {}

    @staticmethod
    def usable() -> bool:
        import torch

        try:
            return torch.cuda.is_available() and _driver_capture_info() is not None
        except Exception:
            return False

    def began(self, ledger: Ledger) -> None:
        capture_id = self._capture_id_of(self.stream())
        if capture_id is not None:
            with _LOCK.lock:
                self._ledgers[capture_id] = ledger
            ledger.capture_id = capture_id

    def ended(self, ledger: Ledger) -> None:
        super().ended(ledger)
        with _LOCK.lock:
            if self._ledgers.get(ledger.capture_id) is ledger:
                del self._ledgers[ledger.capture_id]

    def ask(self, stream: Any) -> Ledger | None:
        capture_id = self._capture_id_of(stream)
        return None if capture_id is None else self._ledgers.get(capture_id)


class ByThread:
    """Neither is here (no CUDA): a launch belongs to the capture begun on its own thread
    (launches made on other threads, such as autograd's engine threads, are missed)."""

    how = "the capturing thread (no CUDA capture id here)"

    def __init__(self, capturing: Capturing) -> None:
        self.capturing = capturing

    def began(self, ledger: Ledger) -> None:
        pass

    def ended(self, ledger: Ledger) -> None:
        pass

    def current(self) -> Ledger | None:
        stack = self.capturing.stack
        return stack[-1] if stack else None


class CaptureIdentity:
    """Which capture in progress a launch goes into: the one the launching thread's current
    stream takes part in. CUDA gives every stream that takes part in a capture (the capturing
    stream, and every stream joined to it by an event wait, such as autograd's during a
    captured backward) the capture's id; the first of these ways to ask that works here is
    used (``how`` says which): ``ByCapturingGraph``, ``ByCaptureId``, else ``ByThread``."""

    def __init__(self, ledgers: Any = None, capturing: Capturing | None = None,
                 way: Any = None) -> None:
        self.ledgers = ledgers
        self.capturing = capturing if capturing is not None else Capturing()
        self.way = way

    @property
    def how(self) -> str:
        return self._way().how

    def _way(self) -> Any:
        if self.way is None:
            try:
                self.way = (ByCapturingGraph(self.ledgers) if ByCapturingGraph.usable() else
                            ByCaptureId() if ByCaptureId.usable() else
                            ByThread(self.capturing))
            except Exception:
                self.way = ByThread(self.capturing)
        return self.way

    def began(self, ledger: Ledger) -> None:
        self._way().began(ledger)

    def ended(self, ledger: Ledger) -> None:
        self._way().ended(ledger)

    def current(self) -> Ledger | None:
        """The ledger of the capture the current stream takes part in; None if none."""
        way = self.way
        return (way if way is not None else self._way()).current()


_CAPTURE_STATUS_ACTIVE = 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE


@functools.cache
def _driver_capture_info() -> Any:
    """``cuStreamGetCaptureInfo(stream, *status, *id)`` from the CUDA driver torch loaded (the
    first version of the call, which every driver since CUDA 10.1 exports); None if absent."""
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
        function = driver.cuStreamGetCaptureInfo
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
                         ctypes.POINTER(ctypes.c_uint64)]
    function.restype = ctypes.c_int
    return function


@functools.cache
def _current_raw_stream() -> Callable[[], int]:
    """() -> the current CUDA stream's handle: torch's C functions where it has them
    (``torch.cuda.current_stream()`` builds a Python object, ~10 us in a capture)."""
    import torch

    raw, device = (getattr(torch._C, name, None)
                   for name in ("_cuda_getCurrentRawStream", "_cuda_getDevice"))
    if raw is not None and device is not None:
        return lambda: raw(device())
    return lambda: torch.cuda.current_stream().cuda_stream


def _cuda_capture_id(stream: int) -> int | None:
    """The id of the capture ``stream`` takes part in, or None."""
    import ctypes

    status, capture_id = ctypes.c_int(), ctypes.c_uint64()
    if _driver_capture_info()(stream, ctypes.byref(status), ctypes.byref(capture_id)) != 0:
        return None
    return capture_id.value if status.value == _CAPTURE_STATUS_ACTIVE else None

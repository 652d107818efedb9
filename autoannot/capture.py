"""CUDA graphs: know when a capture is in progress, keep a ledger of the collectives each graph
captured, and mark each replay in the profiler trace — with no CUDA call on the hot path and
no toolsId support needed.

* ``CUDAGraph.capture_begin`` / ``capture_end`` are wrapped to count captures (the collective
  wrappers only read the count) and to name each graph ``autoannot.graph.<n>``.
* While a graph is being captured, every annotation context entered for a launch into that
  capture appends ``{"annotation", "kernels"}`` to that graph's ledger, in launch order. A
  launch is tied to its capture by the capture itself, not by the thread that made it: CUDA
  gives every stream that takes part in a capture (the capturing stream and every stream
  joined to it, such as autograd's during a captured backward) the same capture; the agent
  asks which capture the launching thread's current stream is in (``CaptureIdentity``).
* ``CUDAGraph.replay`` is wrapped: while the profiler runs, each replay of a graph with a ledger
  runs inside ``record_function("autoannot.replay:<graph>")``, so the trace tool can tell which
  graph each ``cudaGraphLaunch`` launched.
* Where torch's own path works (``mark_kernels`` + ``cudaGraphNodeGetToolsId``), every
  ``torch.cuda.graph`` capture gets ``enable_annotations=True`` unless the user said otherwise or
  ``AUTOANNOT_TORCH_ANNOTATIONS=0``.
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import inspect
import itertools
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import wrapt

from autoannot import features, locks
from autoannot.recorder import call_site
from autoannot.state import STATE
from autoannot.traces.names import GRAPH_PREFIX, REPLAY_PREFIX

_counter = itertools.count()
_lock = locks.renewed(sys.modules[__name__], "_lock")


class Ledger:
    """What one captured graph launches, in capture order: ``entries``, each ``{"api",
    "annotation", "kernels", "call_site"}``."""

    __slots__ = ("__weakref__", "_entries", "capture_id", "capturing", "holder", "launched",
                 "name", "native_capture")

    def __init__(self, name: str) -> None:
        self.name = name
        self.capturing = True  # until its capture ends
        #: What a launch notes while the graph is captured: (api, annotation, kernels, call
        #: site, order), made into entries when they are read (a launch pays for a tuple, not a
        #: dict). ``order``: the native kernel's notes are numbered 1, 2, ...; a launch noted
        #: here after n of them has n + 0.5 (0 without the kernel): by it the notes join these
        #: when the capture ends.
        self.launched: list[tuple[str, dict[str, Any], tuple[str, ...], str, float]] = []
        self._entries: list[dict[str, Any]] = []
        self.capture_id: Any = None  # CUDA's id of the capture, where it is asked for
        self.native_capture: int | None = None  # the capture's id, as the native kernel asks
        self.holder: Any = None  # (thread, dispatcher layer) holding the layer for it

    @property
    def entries(self) -> list[dict[str, Any]]:
        """The graph's collectives, in capture order (the same list each time: appending to
        it adds an entry)."""
        launched = self.launched
        if launched:
            with _lock:
                count = len(launched)
                self._entries += [{"api": api, "annotation": annotation, "kernels": list(kernels),
                                   "call_site": site}
                                  for api, annotation, kernels, site, _ in launched[:count]]
                del launched[:count]
        return self._entries


class Ledgers:
    """The ledgers of the graphs alive, by name, and of the last ``KEEP_RETIRED`` graphs
    freed or captured again (a trace exported just after may still replay them): as many as
    the process has graphs, however many it captures over its life."""

    KEEP_RETIRED = 64

    def __init__(self) -> None:
        self.live: dict[str, Ledger] = {}
        self.retired: dict[str, Ledger] = {}

    def add(self, ledger: Ledger, graph: Any) -> None:
        import weakref

        with _lock:
            self.live[ledger.name] = ledger
        # A graph class without weak references: its ledger is retired at its next capture.
        with contextlib.suppress(TypeError):
            weakref.finalize(graph, self.retire, ledger.name)

    def retire(self, name: str) -> None:
        with _lock:
            ledger = self.live.pop(name, None)
            if ledger is None:
                return
            self.retired[name] = ledger
            while len(self.retired) > self.KEEP_RETIRED:
                del self.retired[next(iter(self.retired))]

    def get(self, name: str, default: Any = None) -> Any:
        ledger = self.live.get(name) or self.retired.get(name)
        return default if ledger is None else ledger

    def all(self) -> dict[str, Ledger]:
        """Every ledger kept, in capture order."""
        with _lock:
            merged = {**self.retired, **self.live}
        return dict(sorted(merged.items(), key=lambda item: _graph_number(item[0])))

    def __len__(self) -> int:
        return len(self.live) + len(self.retired)

    def __iter__(self) -> Any:
        return iter(self.all())

    def __contains__(self, name: object) -> bool:
        return name in self.live or name in self.retired

    def __getitem__(self, name: str) -> Ledger:
        ledger = self.get(name)
        if ledger is None:
            raise KeyError(name)
        return ledger

    def __setitem__(self, name: str, ledger: Ledger) -> None:
        with _lock:
            self.live[name] = ledger

    def __delitem__(self, name: str) -> None:
        with _lock:
            if self.live.pop(name, None) is None:
                del self.retired[name]


def _graph_number(name: str) -> int:
    tail = name.rpartition(".")[2]
    return int(tail) if tail.isdigit() else -1


#: The ledgers of the graphs captured with the agent on (for the ledger files).
LEDGERS = Ledgers()


class _Capturing(_thread._local):
    def __init__(self) -> None:
        self.stack: list[Ledger] = []


_capturing = _Capturing()


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
        with _lock:
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
                with _lock:
                    if ledger.capturing:  # not ended meanwhile (see ended())
                        self._streams[stream] = ledger
        return ledger

    def ask(self, stream: Any) -> Ledger | None:
        raise NotImplementedError


class ByCapturingGraph(_ByStream):
    """torch's ``CUDAGraph.get_currently_capturing_graph()``: it asks CUDA for the current
    stream's capture id and returns the graph being captured under it."""

    how = "torch's get_currently_capturing_graph (CUDA capture id)"

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
        return _ledger_of(graph)


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
            with _lock:
                self._ledgers[capture_id] = ledger
            ledger.capture_id = capture_id

    def ended(self, ledger: Ledger) -> None:
        super().ended(ledger)
        with _lock:
            if self._ledgers.get(ledger.capture_id) is ledger:
                del self._ledgers[ledger.capture_id]

    def ask(self, stream: Any) -> Ledger | None:
        capture_id = self._capture_id_of(stream)
        return None if capture_id is None else self._ledgers.get(capture_id)


class ByThread:
    """Neither is here (no CUDA): a launch belongs to the capture begun on its own thread
    (launches made on other threads, such as autograd's engine threads, are missed)."""

    how = "the capturing thread (no CUDA capture id here)"

    def began(self, ledger: Ledger) -> None:
        pass

    def ended(self, ledger: Ledger) -> None:
        pass

    def current(self) -> Ledger | None:
        stack = _capturing.stack
        return stack[-1] if stack else None


class CaptureIdentity:
    """Which capture in progress a launch goes into: the one the launching thread's current
    stream takes part in. CUDA gives every stream that takes part in a capture (the capturing
    stream, and every stream joined to it by an event wait, such as autograd's during a
    captured backward) the capture's id; the first of these ways to ask that works here is
    used (``how`` says which): ``ByCapturingGraph``, ``ByCaptureId``, else ``ByThread``."""

    def __init__(self, way: Any = None) -> None:
        self.way = way

    @property
    def how(self) -> str:
        return self._way().how

    def _way(self) -> Any:
        if self.way is None:
            try:
                self.way = (ByCapturingGraph() if ByCapturingGraph.usable() else
                            ByCaptureId() if ByCaptureId.usable() else ByThread())
            except Exception:
                self.way = ByThread()
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


IDENTITY = CaptureIdentity()


def on_annotation(api: str, annotation: dict[str, Any], kernels: tuple[str, ...],
                  site: str | None) -> None:
    """A collective launched while a capture is in progress: add it to its graph's ledger."""
    ledger = IDENTITY.current()
    if ledger is None:
        return  # this launch goes into no capture (eager work on another stream)
    if site is None:  # from our caller's caller: the user's line, mostly
        site = call_site(3)
    native = STATE.native  # (after the native kernel's notes so far; see _join_native_notes)
    ledger.launched.append((api, annotation, kernels, site,
                            0 if native is None else native.order[0] + 0.5))


def _ledger_of(graph: Any) -> Ledger | None:
    name = getattr(graph, "_autoannot_graph", None)
    return LEDGERS.get(name) if name is not None else None


def _said(step: str, exc: Exception) -> None:
    from autoannot import diagnostics

    diagnostics.warn_once(f"CUDAGraph.{step}", "the agent's part", exc)


def _capture_begin(wrapped: Any, graph: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    try:
        _began(graph)
    except Exception as exc:  # the capture goes on; its collectives may go unannotated
        _said("capture_begin", exc)
    return result


def _began(graph: Any) -> None:
    previous = getattr(graph, "_autoannot_graph", None)
    if previous is not None:  # captured again (after reset()): its old ledger is retired
        LEDGERS.retire(previous)
    ledger = Ledger(f"{GRAPH_PREFIX}{next(_counter)}")
    with contextlib.suppress(AttributeError):  # a graph class without attributes: no ledger
        graph._autoannot_graph = ledger.name
    LEDGERS.add(ledger, graph)
    _capturing.stack.append(ledger)
    try:
        IDENTITY.began(ledger)
    except Exception as exc:  # the capture goes on; its ledger stays empty
        from autoannot import diagnostics

        diagnostics.warn_once("CUDAGraph.capture_begin", "identifying the capture", exc)
    layer = _INSTRUMENTATION[0].dispatcher if _INSTRUMENTATION else None
    if layer is not None:  # C++-origin launches on this thread (and autograd's) are seen
        layer.hold()
        ledger.holder = (_thread.get_ident(), layer)
        if layer.native is not None:  # where the native kernel notes them, by this id
            layer.native.forget_streams()  # (a stream it knew may be in this capture now)
            ledger.native_capture = layer.native.current_capture()
    STATE.capture_started()


def _capture_end(wrapped: Any, graph: Any, args: tuple, kwargs: dict) -> Any:
    try:
        result = wrapped(*args, **kwargs)
    finally:
        try:
            _ended(graph)
        except Exception as exc:
            _said("capture_end", exc)
    _verify(graph)
    return result


def _verify(graph: Any) -> None:
    """``AUTOANNOT_VERIFY=1``: compare the graph's collectives with the other ranks' now;
    a difference raises ``SequenceMismatch`` (on purpose: the replay would hang)."""
    from autoannot import config

    if not config.flag("AUTOANNOT_VERIFY", False):
        return
    from autoannot.traces import sequences

    ledger = _ledger_of(graph)
    if ledger is None or not STATE.live:
        return
    try:
        sequences.verify_capture(ledger.name, ledger.entries)
    except sequences.SequenceMismatch:
        raise
    except Exception as exc:  # the comparison itself failed: the capture stands
        _said("capture_end (AUTOANNOT_VERIFY)", exc)


def _ended(graph: Any) -> None:
    stack = _capturing.stack
    ledger = _ledger_of(graph)
    if ledger is not None and ledger in stack:
        stack.remove(ledger)
    elif stack:
        ledger = stack.pop()
    try:
        if ledger is not None:
            ledger.capturing = False
            IDENTITY.ended(ledger)
            if ledger.native_capture is not None:
                _join_native_notes(ledger)
            holder, ledger.holder = ledger.holder, None
            if holder is not None and holder[0] == _thread.get_ident():
                holder[1].release()
    finally:
        STATE.capture_ended()


@contextlib.contextmanager
def stand_in(test_capture: int = 0) -> Any:
    """A capture with no CUDA, for tests and benchmarks: CUDAGraph's wrappers around a
    stand-in graph (yielded; its ledger is ``LEDGERS[graph._autoannot_graph]``). Where the
    native kernel is loaded, ``test_capture`` stands in for CUDA's capture id (0: it lets the
    launches through to the Python side, as without it)."""
    from autoannot import native

    module = native.loaded()
    if module is not None:
        module.set_test_capture(test_capture)
    graph = type("Graph", (), {})()
    _capture_begin(lambda: None, graph, (), {})
    try:
        yield graph
    finally:
        _capture_end(lambda: None, graph, (), {})
        if module is not None:
            module.set_test_capture(0)


def _join_native_notes(ledger: Ledger) -> None:
    """The launches the native kernel noted in this capture join the ledger, in launch
    order."""
    from autoannot import dispatch

    layer = _INSTRUMENTATION[0].dispatcher if _INSTRUMENTATION else None
    native = layer.native if layer is not None else None
    if native is None:
        return
    try:
        native.forget_streams()  # (the streams of this capture are in none now)
        noted = dispatch.launched_of_notes(native, ledger.native_capture)
        if STATE.captures <= 1:  # no other capture in progress: notes no ledger will claim
            native.drain(-1)  # (a capture begun without our wrappers) are let go
    except Exception as exc:  # the capture stands; these launches go unannotated
        _said("capture_end (native kernel's notes)", exc)
        return
    if noted:
        with _lock:
            ledger.launched[:] = sorted(ledger.launched + noted, key=lambda launch: launch[4])


def _profiler_running() -> bool:
    """Whether a profiler records on this thread or for the whole process: one started by a
    Python profiler object, or on demand (Kineto's daemon, dynolog), which sets no Python
    flag."""
    import torch

    if torch.autograd.profiler._is_profiler_enabled:
        return True
    kind = getattr(torch._C._autograd, "_profiler_type", None)
    return kind is not None and getattr(kind(), "name", "NONE") != "NONE"


def _replay(wrapped: Any, graph: Any, args: tuple, kwargs: dict) -> Any:
    try:
        marker = _replay_marker(graph)
    except Exception as exc:  # the replay runs, unmarked
        _said("replay", exc)
        marker = None
    if marker is None:
        return wrapped(*args, **kwargs)
    with marker:
        return wrapped(*args, **kwargs)


def _replay_marker(graph: Any) -> Any:
    """``record_function("autoannot.replay:<graph>")`` while a profiler records; else None."""
    name = getattr(graph, "_autoannot_graph", None)
    if name is None or not STATE.live or not _profiler_running():
        return None
    import torch

    return torch.profiler.record_function(REPLAY_PREFIX + name)


def _graph_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.cuda.graph(...)``: turn torch's own annotations on where they work."""
    if "enable_annotations" not in kwargs and _torch_annotations_usable():
        kwargs = {**kwargs, "enable_annotations": True}
    return wrapped(*args, **kwargs)


def _torch_annotations_usable() -> bool:
    from autoannot import config

    return config.from_environment().torch_annotations and features.tools_id_usable()


_METHODS = {"capture_begin": _capture_begin, "capture_end": _capture_end, "replay": _replay}
_INSTRUMENTATION: list[Any] = []  # the agent's Instrumentation, given at install


def wrap_attribute(owner: Any, name: str, wrapper: Any, instrumentation: Any) -> list[Any]:
    """Put a proxy (the one cached for the original) over ``owner.name``."""
    from autoannot.patching import Patch

    original = owner.__dict__.get(name) if owner is not None else None
    if original is None or instrumentation.proxies.is_proxy(original):
        return []  # absent, or already ours
    proxy = instrumentation.proxies.get(original) or instrumentation.proxies.put(
        original, wrapt.FunctionWrapper(original, wrapper))
    setattr(owner, name, proxy)
    return [Patch(owner, name, original, proxy)]


def install(graphs: ModuleType, instrumentation: Any) -> list[Any]:
    """Wrap ``graphs.CUDAGraph``'s capture and replay methods and ``graphs.graph.__init__``."""
    from autoannot import annotation

    _INSTRUMENTATION[:] = [instrumentation]
    patches: list[Any] = []
    graph_class = getattr(graphs, "CUDAGraph", None)
    for name, wrapper in _METHODS.items():
        patches += wrap_attribute(graph_class, name, wrapper, instrumentation)
    context_class = getattr(graphs, "graph", None)
    init = getattr(context_class, "__init__", None)
    if init is not None and "enable_annotations" in _parameters(init):
        patches += wrap_attribute(context_class, "__init__", _graph_init, instrumentation)
    if on_annotation not in annotation.capture_listeners:
        annotation.capture_listeners.append(on_annotation)
    return patches


def _parameters(function: Any) -> Any:
    try:
        return inspect.signature(function).parameters
    except (TypeError, ValueError):
        return {}

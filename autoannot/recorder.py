"""``record()``: collect one Record per collective launch, from any thread."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from time import monotonic as _monotonic
from typing import Any, NamedTuple

from autoannot import vocabulary as V
from autoannot.state import STATE


class Record(NamedTuple):
    """One collective launch seen by the agent."""

    api: str  # the function called, e.g. "all_reduce" or "funcol.all_gather_tensor"
    annotation: dict[str, Any]  # what the annotation context was given
    call_site: str  # "path.py:123": the first frame outside torch and autoannot
    cpu_only: dict[str, Any]  # "Rank", "Global rank start/stride": the CPU op's own keys

    @property
    def param_comms(self) -> dict[str, Any]:
        """The args of the eager CPU ``record_param_comms`` op: the kernel's plus its own
        (empty for a launch whose eager kernel carries no collective args)."""
        if V.COLLECTIVE_NAME not in self.annotation:
            return {}
        kernel = {k: v for k, v in self.annotation.items() if k not in _LANE_KEYS}
        return {**kernel, **self.cpu_only}


_LANE_KEYS = (V.NAME, V.STREAM)


class Recording(list):  # list[Record], live: grows while the block runs
    """The records of one ``record()`` block."""

    def apis(self) -> list[str]:
        return [r.api for r in self]


@contextlib.contextmanager
def record() -> Iterator[Recording]:
    """Record every collective launched while the block runs: through the Python API, from any
    thread; from C++ (DDP's reducer, autograd's engine, ``pg.allreduce``), on this thread, the
    thread that turned the agent on, and the threads torch runs their work on.

    Works with or without CUDA; requires ``autoannot.enable()`` (or ``AUTOANNOT=1``) to see calls:
    opened with the agent off, it says so once (and records what launches once it is on).
    """
    if not STATE.live:
        _say_agent_off()
    recording = Recording()
    dispatch = sys.modules.get("autoannot.dispatch")  # loaded with torch while the agent is on
    if dispatch is not None:
        dispatch.include_thread()
    STATE.open_recorder(recording)
    try:
        yield recording
    finally:
        STATE.close_recorder(recording)
        if dispatch is not None:
            dispatch.release_thread()


def _say_agent_off() -> None:
    from autoannot import diagnostics

    diagnostics.say_once(
        "record:off", "autoannot.record() was opened with the agent off: it records nothing "
        "until autoannot.enable() (or AUTOANNOT=1)", stacklevel=5)


class FileSink:
    """Appends each Record as one JSON line to a file (``AUTOANNOT_RECORD``).

    ``{rank}`` and ``{pid}`` in the path are filled in at the first record: the rank from
    torch.distributed when initialized, else the ``RANK`` variable torchrun sets. Lines are
    buffered and written out at least every ``FLUSH_EVERY_S`` seconds and at exit (a process
    killed, or leaving through ``os._exit``, loses at most that much); a launch seen before
    reuses the JSON of its annotation.
    """

    FLUSH_EVERY_S = 0.5

    def __init__(self, template: str) -> None:
        self.template = template
        self._file: Any = None
        self._flushed = 0.0
        #: (id(annotation), id(cpu_only)) -> (annotation, cpu_only, their JSON): the records
        #: of one distinct launch share those dicts (never mutated).
        self._texts: dict[tuple[int, int], tuple[Any, Any, str]] = {}

    def _open(self) -> Any:
        import atexit

        rank = os.environ.get("RANK", "0")
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank = str(dist.get_rank())
        path = self.template.format(rank=rank, pid=os.getpid())
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        atexit.register(self.close)
        return open(path, "a", encoding="utf-8")

    def append(self, entry: Record) -> None:
        file = self._file
        if file is None:
            file = self._file = self._open()
        annotation, cpu_only = entry.annotation, entry.cpu_only
        key = (id(annotation), id(cpu_only))
        known = self._texts.get(key)
        if known is None or known[0] is not annotation or known[1] is not cpu_only:
            if len(self._texts) >= 4096:
                self._texts.clear()
            text = (f'"annotation": {_dumps(annotation)}, '
                    f'"param_comms": {_dumps(entry.param_comms)}}}\n')
            known = self._texts[key] = (annotation, cpu_only, text)
        file.write(f'{{"api": {_quote(entry.api)}, "call_site": {_quote(entry.call_site)}, '
                   + known[2])
        now = _monotonic()
        if now - self._flushed >= self.FLUSH_EVERY_S:
            file.flush()
            self._flushed = now

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value)


def _quote(text: str) -> str:
    """``json.dumps`` of a string, without its Python-level overhead."""
    import json.encoder

    global _quote
    _quote = json.encoder.encode_basestring_ascii  # type: ignore[assignment]
    return _quote(text)


def publish(entry: Record) -> None:
    for recording in STATE.recorders:
        recording.append(entry)


def new_record(api: str, annotation: dict[str, Any], site: str, cpu_only: dict[str, Any]
               ) -> Record:
    """``Record(api, annotation, site, cpu_only)``, without NamedTuple's argument parsing."""
    return _tuple_new(Record, (api, annotation, site, cpu_only))


_tuple_new = tuple.__new__


_SKIP_PREFIXES: tuple[str, ...] = ()
_OWN_PREFIX = os.path.dirname(os.path.abspath(__file__))  # autoannot's own files


def _skip_prefixes() -> tuple[str, ...]:
    global _SKIP_PREFIXES
    if not _SKIP_PREFIXES:
        import torch
        import wrapt

        roots = [os.path.dirname(m.__file__) for m in (torch, wrapt) if m.__file__]
        roots += [_OWN_PREFIX, os.path.dirname(contextlib.__file__) + os.sep + "contextlib"]
        _SKIP_PREFIXES = tuple(roots)
    return _SKIP_PREFIXES


#: The call site of a launch made from C++ with no Python code on the thread's stack (autograd's
#: engine threads: DDP's reducer, a backward's collectives).
NO_PYTHON_CALLER = "<C++: no Python caller>"
#: The call site of a launch whose Python callers are all torch's own code.
TORCH_CALLER = "<torch: no user frame>"


#: code object -> its file name when that is the user's (not torch, wrapt, contextlib or
#: autoannot), else None: a launch site is looked up once per function, not per call.
_USER_FILES: dict[Any, str | None] = {}


def call_site(depth: int = 2) -> str:
    """``"file.py:line"`` of the first frame outside torch, wrapt, contextlib and autoannot
    (``depth``: where to start, as for ``sys._getframe``)."""
    frame = sys._getframe(depth)
    outside_autoannot = False
    while frame is not None:
        code = frame.f_code
        try:
            filename = _USER_FILES[code]
        except KeyError:
            filename = _classify(code)
        if filename is not None:
            return f"{filename}:{frame.f_lineno}"
        outside_autoannot = outside_autoannot or not code.co_filename.startswith(_OWN_PREFIX)
        frame = frame.f_back
    return TORCH_CALLER if outside_autoannot else NO_PYTHON_CALLER


def _classify(code: Any) -> str | None:
    skip = _SKIP_PREFIXES or _skip_prefixes()
    filename = code.co_filename
    user = None if filename.startswith(skip) else filename
    if len(_USER_FILES) >= 65536:  # code objects of generated functions: bounded
        _USER_FILES.clear()
    _USER_FILES[code] = user
    return user


"""``record()``: collect one Record per collective launch, from any thread."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

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
        if "Collective name" not in self.annotation:
            return {}
        kernel = {k: v for k, v in self.annotation.items() if k not in _LANE_KEYS}
        return {**kernel, **self.cpu_only}


_LANE_KEYS = ("name", "stream")


class Recording(list):  # list[Record], live: grows while the block runs
    """The records of one ``record()`` block."""

    def apis(self) -> list[str]:
        return [r.api for r in self]


@contextlib.contextmanager
def record() -> Iterator[Recording]:
    """Record every collective launched while the block runs: through the Python API, from any
    thread; from C++ (DDP's reducer, autograd's engine, ``pg.allreduce``), on this thread, the
    thread that turned the agent on, and the threads torch runs their work on.

    Works with or without CUDA; requires ``autoannot.enable()`` (or ``AUTOANNOT=1``) to see calls.
    """
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


class FileSink:
    """Appends each Record as one JSON line to a file (``AUTOANNOT_RECORD``).

    ``{rank}`` and ``{pid}`` in the path are filled in at the first record: the rank from
    torch.distributed when initialized, else the ``RANK`` variable torchrun sets.
    """

    def __init__(self, template: str) -> None:
        self.template = template
        self._file: Any = None

    def _open(self) -> Any:
        rank = os.environ.get("RANK", "0")
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank = str(dist.get_rank())
        path = self.template.format(rank=rank, pid=os.getpid())
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return open(path, "a", encoding="utf-8", buffering=1)  # line-buffered

    def append(self, entry: Record) -> None:
        import json

        if self._file is None:
            self._file = self._open()
        line = {"api": entry.api, "call_site": entry.call_site, "annotation": entry.annotation,
                "param_comms": entry.param_comms}
        self._file.write(json.dumps(line) + "\n")


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


def call_site(depth: int = 2) -> str:
    """``"file.py:line"`` of the first frame outside torch, wrapt, contextlib and autoannot
    (``depth``: where to start, as for ``sys._getframe``)."""
    skip = _SKIP_PREFIXES or _skip_prefixes()
    frame = sys._getframe(depth)
    outside_autoannot = False
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(skip):
            return f"{filename}:{frame.f_lineno}"
        outside_autoannot = outside_autoannot or not filename.startswith(_OWN_PREFIX)
        frame = frame.f_back
    return TORCH_CALLER if outside_autoannot else NO_PYTHON_CALLER


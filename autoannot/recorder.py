"""``record()``: collect one Record per collective launch, from any thread."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
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
def record(dispatcher: bool = False) -> Iterator[Recording]:
    """Record every collective launched through torch's Python API while the block runs, from
    any thread (``dist.*``, funcol, DTensor and FSDP2 through them).

    ``dispatcher=True``: also the launches that reach torch's dispatcher without a Python
    proxy — DDP's reducer, autograd's engine, ``pg.allreduce(...)``, compiled code — made on
    this thread and on the threads torch runs its work on. That includes a dispatch key on
    this thread, which ``torch.compile`` guards on: a function compiled outside such a block
    is compiled again when called inside one. (A plain ``record()`` changes nothing torch
    sees.) With ``AUTOANNOT_OPS=0`` it records what a plain one does.

    Works with or without CUDA; requires ``autoannot.enable()`` (or ``AUTOANNOT=1``) to see calls:
    opened with the agent off, it says so once (and records what launches once it is on).
    """
    if not STATE.live:
        _say_once("record:off", "autoannot.record() was opened with the agent off: it records "
                  "nothing until autoannot.enable() (or AUTOANNOT=1)", stacklevel=4)
    recording = Recording()
    layer = _dispatcher_layer() if dispatcher else None
    if layer is not None:
        layer.hold()
    STATE.open_recorder(recording)
    try:
        yield recording
    finally:
        STATE.close_recorder(recording)
        if layer is not None:
            layer.release()


def _dispatcher_layer() -> Any:
    from autoannot.patching import INSTRUMENTATION

    layer = INSTRUMENTATION.dispatcher
    if layer is None and STATE.live:
        _say_once("record:dispatcher", "autoannot.record(dispatcher=True): no dispatcher "
                  "layer here (AUTOANNOT_OPS=0, torch not loaded yet, or a torch that cannot "
                  "take its kernels: autoannot doctor says which); recording Python-API "
                  "launches only", stacklevel=5)
    return layer


def _say_once(key: str, message: str, stacklevel: int = 4) -> None:
    """Say once, as a warning pointing ``stacklevel`` frames up from this function's caller."""
    from autoannot import diagnostics

    diagnostics.say_once(key, message, stacklevel=stacklevel + 1)


def publish(entry: Record) -> None:
    """Give a launch that returned to the open recorders."""
    for recording in STATE.recorders:
        recording.append(entry)


def enter(entry: Record) -> None:
    """Write a launch about to run to the open journals (``AUTOANNOT_RECORD``). A journal that
    fails is closed, said once; the launch, and the in-memory recorders, go on."""
    for journal in STATE.journals:
        try:
            journal.enter(entry)
        except Exception as exc:
            STATE.close_journal(journal)
            _say_once(f"journal:{id(journal)}", f"autoannot: AUTOANNOT_RECORD: cannot write "
                      f"{getattr(journal, 'path', journal)} ({type(exc).__name__}: {exc}); "
                      "no more lines are written to it")


def new_record(api: str, annotation: dict[str, Any], site: str, cpu_only: dict[str, Any]
               ) -> Record:
    """``Record(api, annotation, site, cpu_only)``, without NamedTuple's argument parsing."""
    return _tuple_new(Record, (api, annotation, site, cpu_only))


_tuple_new = tuple.__new__


_OWN_PREFIX = os.path.dirname(os.path.abspath(__file__))  # autoannot's own files
_PACKAGE_FOLDERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


class _Places:
    """Where no call site is: torch (but its tests, ``torch/testing``: their lines are the
    callers), wrapt, autoannot, and the standard library (threading, multiprocessing, runpy,
    unittest: no collective is written there), but packages installed inside its folder."""

    def __init__(self) -> None:
        import sysconfig

        import torch
        import wrapt

        roots = [os.path.dirname(m.__file__) + os.sep for m in (torch, wrapt) if m.__file__]
        self.libraries = (*roots, _OWN_PREFIX + os.sep)
        self.tests = (os.path.join(os.path.dirname(torch.__file__ or ""), "testing") + os.sep,)
        paths = sysconfig.get_paths()
        self.stdlib = tuple({paths[name] + os.sep for name in ("stdlib", "platstdlib")})

    def is_library(self, filename: str) -> bool:
        if filename.startswith(self.tests):
            return False
        if filename.startswith(self.libraries):
            return True
        if filename.startswith(self.stdlib):
            return not any(folder in filename for folder in _PACKAGE_FOLDERS)
        return False


_PLACES: list[_Places] = []


#: The call site of a launch made from C++ with no Python code on the thread's stack (autograd's
#: engine threads: DDP's reducer, a backward's collectives).
NO_PYTHON_CALLER = "<C++: no Python caller>"
#: The call site of a C++-origin launch the native kernel noted in a capture (it reads no
#: Python frames: the launching thread does not hold the GIL; a Python-API launch it notes
#: has its proxy's call site).
NATIVE_CALLER = "<C++: noted by the native kernel>"
#: The call site of a launch whose Python callers are all torch's or the standard library's.
TORCH_CALLER = "<no user frame>"


#: code object -> None when it is not the user's (see ``_Places``: look further up), else its
#: call sites, ``{f_lasti: "file.py:line"}``: a launch site is looked up once per call site.
SITES: dict[Any, dict[int, str] | None] = {}


def call_site(depth: int = 2) -> str:
    """``"file.py:line"`` of the first frame outside torch (its tests count as callers), wrapt,
    autoannot and the standard library (``depth``: where to start, as for ``sys._getframe``)."""
    return site_from(sys._getframe(depth))


def site_from(frame: Any) -> str:
    """``call_site`` from ``frame`` up (None: no Python frame)."""
    outside_autoannot = False
    while frame is not None:
        code = frame.f_code
        try:
            sites = SITES[code]
        except KeyError:
            sites = _classify(code)
        if sites is not None:
            site = sites.get(frame.f_lasti)
            if site is None:
                site = sites[frame.f_lasti] = f"{code.co_filename}:{frame.f_lineno}"
            return site
        outside_autoannot = outside_autoannot or not code.co_filename.startswith(_OWN_PREFIX)
        frame = frame.f_back
    return TORCH_CALLER if outside_autoannot else NO_PYTHON_CALLER


def _classify(code: Any) -> dict[int, str] | None:
    if not _PLACES:
        _PLACES.append(_Places())
    sites = None if _PLACES[0].is_library(code.co_filename) else {}
    if len(SITES) >= 65536:  # code objects of generated functions: bounded
        SITES.clear()
    SITES[code] = sites
    return sites

"""``record()``: collect one Record per collective launch, from any thread."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from autoannot.agent.instrumentation import INSTRUMENTATION
from autoannot.keep.records import Record, Recording

__all__ = ["Record", "Recording", "record"]


@contextlib.contextmanager
def record(python_api_only: bool = False, *, dispatcher: bool | None = None
           ) -> Iterator[Recording]:
    """Record every collective launched while the block runs: through torch's Python API
    (``dist.*``, funcol, DTensor and FSDP2 through them), from any thread, and below it — DDP's
    reducer, autograd's engine threads, compiled code, ``pg.allreduce(...)``, C++.

    Launches below the Python API are seen by torch's process-group hooks where torch has
    them (>= 2.14): on every thread, for collectives only. On older torch, by the native
    observer where it is built
    (``autoannot build-native``): on every thread, through torch's RecordFunction callbacks,
    which every operator then pays for while the block is open (measured in
    docs/benchmarks.md). Without it, by the Python layer: on this thread and the threads torch
    runs its work on, through a dispatch key included on this thread meanwhile, which
    ``torch.compile`` guards on (a function compiled outside such a block is compiled once more
    inside one).

    ``python_api_only=True`` leaves those out: the Python API's launches only, and nothing torch
    sees changes. (``dispatcher=`` is its former, inverted name.)

    Works with or without CUDA; requires ``autoannot.enable()`` (or ``AUTOANNOT=1``) to see calls:
    opened with the agent off, it says so once (and records what launches once it is on).
    """
    if dispatcher is not None:
        python_api_only = not dispatcher
    agent = INSTRUMENTATION
    if not agent.state.live:
        _say_once("record:off", "autoannot.record() was opened with the agent off: it records "
                  "nothing until autoannot.enable() (or AUTOANNOT=1)", stacklevel=4)
    recording = Recording()
    recording.python_api_only = python_api_only
    layer = None
    if not python_api_only and agent.observer is None and agent.hooks is None:
        layer = agent.python_layer()
        if layer is None and agent.state.live and agent.config.ops:
            _say_once("record:below", "autoannot.record(): launches below torch's Python API "
                      "(DDP's reducer, compiled code, pg.* calls) cannot be seen here (torch not "
                      "loaded yet, or a torch that cannot take the agent's kernels: autoannot "
                      "doctor says which); recording Python-API launches only", stacklevel=4)
    if layer is not None:
        layer.hold()
    agent.state.open_recorder(recording)
    try:
        yield recording
    finally:
        agent.state.close_recorder(recording)
        if layer is not None:
            layer.release()


def _say_once(key: str, message: str, stacklevel: int = 4) -> None:
    """Say once, as a warning pointing ``stacklevel`` frames up from this function's caller."""
    from autoannot.base import diagnostics

    diagnostics.say_once(key, message, stacklevel=stacklevel + 1)



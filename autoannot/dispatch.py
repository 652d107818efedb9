"""Compiled code: annotate the ``torch.ops._c10d_functional`` ops at torch's dispatcher.

torch.compile never runs the Python collectives we wrap: Dynamo maps ``dist.all_reduce`` & co.
to functional collectives, and the code Inductor or AOTAutograd generates calls
``torch.ops._c10d_functional.<op>.default`` directly. So each op in the table gets a Python
kernel for the ``BackendSelect`` dispatch key — a key every call passes through and that
normally falls through. The kernel runs the same launch wrapper as the Python proxies, around a
redispatch to the keys below ``BackendSelect``, that is, to torch's own kernel.

* Eager callers are annotated once: inside a wrapped Python collective (``CALLS.depth``) the
  kernel only redispatches.
* Tracing is untouched: fake, functional and meta tensors go straight through, and compiled
  graphs hold torch's own ``OpOverload`` objects (we replace no Python object).
* The kernels are registered when the agent is turned on and removed by ``disable()`` when
  that is safe (see ``KernelRegistration``); with nothing to annotate a kernel only
  redispatches (a Python kernel costs ~4 us per call just to be called). An op that already
  has a ``BackendSelect`` kernel (someone else's) is left alone.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from autoannot import collectives, metadata, wrappers
from autoannot.state import CALLS, STATE

DISPATCH_KEY = "BackendSelect"


class KernelRegistration:
    """Our kernels on torch's dispatcher (one registration per process).

    Torch's dispatcher is not safe against a kernel added or removed while another thread
    dispatches through that op (measured: an internal assert in ``SafePyObject``, raised in the
    calling thread). So the kernels are registered when the agent is turned on — at torch's
    import under ``AUTOANNOT=1``, before your threads exist — not later, when a recorder opens
    or a capture starts; and ``undo()`` (from ``disable()``) removes them only while this is
    the only Python thread. Otherwise they stay, as pass-throughs (the agent is off), until a
    later ``undo()`` or the end of the process."""

    __slots__ = ("library", "ops")

    def __init__(self) -> None:
        self.library: Any = None
        self.ops: list[str] = []

    def __repr__(self) -> str:
        return f"KernelRegistration({DISPATCH_KEY}: {', '.join(self.ops) or 'none'})"

    def register(self) -> None:
        with _lock:
            if self.library is not None:  # still there from before a disable(): in use again
                return
            try:
                self.library, self.ops = _register_kernels()
            except Exception as exc:  # the collectives still run, unannotated
                wrappers.warn_once("_c10d_functional", "registering dispatcher kernels", exc)

    def undo(self) -> bool:
        with _lock:
            if self.library is not None and threading.active_count() == 1:
                self.library._destroy()
                self.library, self.ops = None, []
        return True


_lock = threading.Lock()
REGISTRATION = KernelRegistration()


def available() -> bool:
    """Whether this torch can take a Python kernel that redispatches (``with_keyset``)."""
    import inspect

    import torch

    try:
        impl = torch.library.Library.impl
        return ("with_keyset" in inspect.signature(impl).parameters
                and hasattr(torch._C, "_dispatch_keyset_full_after")
                and hasattr(torch.ops, "_c10d_functional"))
    except Exception:
        return False


def _real_tensor_check() -> Callable[[Any], bool]:
    import torch

    plain = (torch.Tensor, torch.nn.Parameter)

    def is_real(value: Any) -> bool:
        """A tensor that holds data (not fake, functional or meta), or a list starting with
        one."""
        if type(value) in (list, tuple):
            value = value[0] if value else None
        return type(value) in plain and not value.is_meta

    return is_real


def _kernel(op: Any, wrapper: wrappers.Wrapper, below: Any) -> Callable[..., Any]:
    redispatch = op.redispatch
    is_real = _real_tensor_check()

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if STATE.demand and not CALLS.depth and args and is_real(args[0]):
            return wrapper(functools.partial(redispatch, keyset & below), None, args, kwargs)
        return redispatch(keyset & below, *args, **kwargs)

    kernel.__name__ = f"autoannot_{op.__name__.replace('.', '_')}"
    return kernel


def install(module: ModuleType) -> list[KernelRegistration]:
    """Register a kernel for every op of the table that this torch has."""
    from autoannot import config

    if not config.from_environment().ops or not available():
        return []
    REGISTRATION.register()
    return [REGISTRATION]


def _register_kernels() -> tuple[Any, list[str]]:
    import torch

    namespace = torch.ops._c10d_functional
    below = torch._C._dispatch_keyset_full_after(getattr(torch._C.DispatchKey, DISPATCH_KEY))
    library = torch.library.Library("_c10d_functional", "IMPL")
    registered = []
    for row in collectives.COLLECTIVES:
        if row.module != collectives.OPS:
            continue
        try:
            op = getattr(namespace, row.api).default
        except AttributeError:  # not in this torch
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), DISPATCH_KEY):
            continue  # someone else's kernel: leave it
        wrapper = wrappers.launch_wrapper(row, metadata.Plan(row, op))
        library.impl(row.api, _kernel(op, wrapper, below), DISPATCH_KEY, with_keyset=True)
        registered.append(row.api)
    return library, registered

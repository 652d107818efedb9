"""Launches no Python proxy sees: Python kernels on torch's dispatcher, present only while the
agent has something to annotate.

Two op families of the table get kernels for the ``BackendSelect`` dispatch key (a key every
call passes through and that normally falls through), each running the proxies' launch
wrapper around a redispatch to the keys below, that is, to torch's own kernel:

* ``torch.ops._c10d_functional``: what compiled code (and funcol's autograd backward)
  launches;
* ``torch.ops.c10d``: what every ``ProcessGroup`` call dispatches through, from Python or C++:
  ``dist.*`` underneath the proxies, DDP's reducer, autograd's engine threads, C++ extensions,
  ``pg.allreduce(...)``.

A Python kernel costs ~5 us per call just to be called, so the kernels are registered only
while there is demand (a recorder open or a CUDA-graph capture in progress) and removed after:
with nothing to annotate a collective pays nothing. Registering is safe while other threads
dispatch through the op; removing is not (measured on 4 threads dispatching: 0 errors in 1,470
registrations, 2 internal asserts in 294 removals). So kernels are added whenever demand
starts, and removed only where no other thread can be dispatching: when demand has ended, this
is the only Python thread (foreign threads, such as autograd's, run only inside a backward) and
it is not inside a backward. A recorder's end removes them at once where that holds; a
capture's end leaves them for the next graph replay (captures come in bursts, and a
registration costs milliseconds). Elsewhere they stay, as pass-throughs, until such a moment.

Eager callers are annotated once: inside a wrapped call (``CALLS.depth``) a kernel only
redispatches. Tracing is untouched: fake, functional and meta tensors go straight through, and
compiled graphs hold torch's own ``OpOverload`` objects (no Python object is replaced). An op
that already has a ``BackendSelect`` kernel (someone else's) is left alone.
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

#: torch.ops namespace -> the table's module for its rows.
FAMILIES = {"_c10d_functional": collectives.OPS, "c10d": collectives.PG_OPS}


class KernelRegistration:
    """Our kernels on torch's dispatcher, registered while there is demand."""

    __slots__ = ("libraries", "lingering", "ops", "registrations", "skipped")

    def __init__(self) -> None:
        self.libraries: list[Any] = []
        self.ops: list[str] = []  # "namespace::op"
        self.skipped: dict[str, str] = {}  # namespace -> why its ops are not annotated
        self.lingering = False  # registered, no demand, waiting for a safe moment to go
        self.registrations = 0  # how many times the kernels were put on (for doctor, tests)

    def __repr__(self) -> str:
        return f"KernelRegistration({', '.join(self.ops) or 'none'})"

    @property
    def registered(self) -> bool:
        return bool(self.libraries)

    def register(self) -> None:
        """Put the kernels on (no-op if they are on)."""
        with _lock:
            self.lingering = False
            if self.libraries:
                return
            self.registrations += 1
            for namespace, module in FAMILIES.items():
                try:
                    why = _unavailable(namespace)
                    if why:
                        self.skipped[namespace] = why
                        continue
                    library, ops = _register_kernels(namespace, module)
                    self.libraries.append(library)
                    self.ops += ops
                except Exception as exc:  # the collectives still run, unannotated
                    self.skipped[namespace] = f"{type(exc).__name__}: {exc}"
                    wrappers.warn_once(namespace, "registering dispatcher kernels", exc)

    def remove_if_safe(self) -> bool:
        """Take the kernels off if there is no demand and no other thread can be dispatching
        through them; else leave them (lingering) for a later moment. True if they are off."""
        with _lock:
            if not self.libraries:
                self.lingering = False
                return True
            if STATE.demand or not _no_other_dispatcher():
                self.lingering = not STATE.demand
                return False
            for library in reversed(self.libraries):
                library._destroy()
            self.libraries, self.ops, self.lingering = [], [], False
            return True

    def undo(self) -> bool:
        """(``disable()``) Remove them where that is safe; else they stay as pass-throughs."""
        self.remove_if_safe()
        return True


_lock = threading.RLock()
REGISTRATION = KernelRegistration()


def _no_other_dispatcher() -> bool:
    """No other thread can be calling into the ops: this is the only Python thread (threads
    torch started that ran Python, such as autograd's, are 'dummy' threads and run only
    inside a backward) and this thread is not inside a backward."""
    import torch

    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and not isinstance(thread, threading._DummyThread):
            return False
    graph_task = getattr(torch._C, "_current_graph_task_id", None)
    return graph_task is None or graph_task() == -1


def on_demand(demand: bool, cause: str) -> None:
    """``STATE``'s demand changed: kernels on when it starts; off when it ends, where safe
    (after a capture: at the next replay, see ``capture._replay``)."""
    try:
        if demand:
            REGISTRATION.register()
        elif cause == "capture":
            with _lock:
                REGISTRATION.lingering = REGISTRATION.registered
        else:
            REGISTRATION.remove_if_safe()
    except Exception as exc:  # never from a recorder's or a capture's edge into user code
        wrappers.warn_once("dispatcher kernels", "switching on or off", exc)


@functools.cache
def _unavailable(namespace: str) -> str:
    """Why this torch cannot take a namespace's kernels ('' if it can)."""
    import inspect

    import torch

    if "with_keyset" not in inspect.signature(torch.library.Library.impl).parameters:
        return "torch.library has no with_keyset kernels"
    if not hasattr(torch._C, "_dispatch_keyset_full_after"):
        return "torch has no _dispatch_keyset_full_after"
    if namespace == "c10d":
        import importlib

        c10d = importlib.import_module("torch.distributed.distributed_c10d")
        if not hasattr(c10d.ProcessGroup, "unbox"):
            return "ProcessGroup has no unbox()"
    return ""


def available() -> bool:
    """Whether this torch can take a Python kernel that redispatches (``with_keyset``)."""
    try:
        return not _unavailable("_c10d_functional")
    except Exception:
        return False


def _real_tensor_check() -> Callable[[Any], bool]:
    import torch

    plain = (torch.Tensor, torch.nn.Parameter)

    def is_real(args: tuple) -> bool:
        """The first tensor of the call (the first argument holding one, looked into lists
        of lists: a gather's output list is empty off the root) holds data: not fake,
        functional or meta."""
        for value in args:
            while type(value) in (list, tuple) and value:
                value = value[0]
            if type(value) in (list, tuple):
                continue  # an empty list
            return type(value) in plain and not value.is_meta
        return False

    return is_real


def _kernel(op: Any, wrapper: wrappers.Wrapper, below: Any) -> Callable[..., Any]:
    redispatch = op.redispatch
    is_real = _real_tensor_check()

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if STATE.demand and not CALLS.depth and is_real(args):
            return wrapper(functools.partial(redispatch, keyset & below), None, args, kwargs)
        return redispatch(keyset & below, *args, **kwargs)

    kernel.__name__ = f"autoannot_{op.__name__.replace('.', '_')}"
    return kernel


def install(module: ModuleType) -> list[KernelRegistration]:
    """Listen for demand: the kernels go on when it starts (now, if it has)."""
    from autoannot import config

    if not config.from_environment().ops or not available():
        return []
    STATE.add_demand_listener(on_demand)
    if STATE.demand:
        REGISTRATION.register()
    return [REGISTRATION]


@functools.cache
def _kernels(namespace: str, module: str) -> tuple[tuple[str, str, Callable[..., Any]], ...]:
    """(op name, qualified name, kernel) for each op of the table this torch has; built once
    (each registration reuses them: a capture pays for the registration alone)."""
    import torch

    ops = getattr(torch.ops, namespace)
    below = torch._C._dispatch_keyset_full_after(getattr(torch._C.DispatchKey, DISPATCH_KEY))
    kernels = []
    for row in collectives.COLLECTIVES:
        if row.module != module:
            continue
        try:
            op = getattr(ops, row.api).default
        except AttributeError:  # not in this torch
            continue
        wrapper = wrappers.launch_wrapper(row, metadata.Plan(row, op))
        kernels.append((row.api, op.name(), _kernel(op, wrapper, below)))
    return tuple(kernels)


def _register_kernels(namespace: str, module: str) -> tuple[Any, list[str]]:
    import torch

    library = torch.library.Library(namespace, "IMPL")
    registered = []
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    for api, name, kernel in _kernels(namespace, module):
        if has_kernel(name, DISPATCH_KEY):
            continue  # someone else's kernel: leave it
        library.impl(api, kernel, DISPATCH_KEY, with_keyset=True)
        registered.append(name)
    return library, registered

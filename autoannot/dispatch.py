"""Launches no Python proxy sees: Python kernels on torch's dispatcher, present only while the
agent has something to annotate.

Two op families of the table get kernels that run the proxies' launch wrapper around a
redispatch to the keys below theirs, that is, to torch's own kernel:

* ``torch.ops._c10d_functional`` (what compiled code, and funcol's autograd backward,
  launches), on ``BackendSelect``: a key every call passes through, on any thread.
* ``torch.ops.c10d`` (what every ``ProcessGroup`` call dispatches through: DDP's reducer,
  autograd's engine threads, C++ extensions, ``pg.allreduce(...)``, and ``dist.*`` below the
  proxies), on ``DeferredInit``: a key in no call's key set unless the calling thread includes
  it (torchdistx's key; torch itself never includes it; the agent registers a fall-through
  for every other op). The agent includes it on the thread that turns it on (the main
  thread under ``AUTOANNOT=1``), for as long as it is on, and on a thread while it has a
  recorder open or a capture in progress; torch carries a thread's included keys to the
  threads that run work for it (autograd's engine threads during a backward started there:
  DDP's reducer, backward collectives). The proxies exclude it around the call they annotate,
  so a Python-API launch is annotated once and does not pay for a Python kernel below
  (~20 us on a ``c10d::`` op: its ProcessGroup goes through the dispatcher as a ScriptObject).
  Including it changes nothing Dynamo compiles or guards on as long as it stays included.

A Python kernel costs microseconds per call just to be called, so the kernels are registered
only while there is demand (a recorder open or a CUDA-graph capture in progress) and removed
after: with nothing to annotate a collective pays nothing. Registering is safe while other
threads dispatch through the op; removing is not (measured on 4 threads dispatching: 0 errors
in 1,470 registrations, 2 internal asserts in 294 removals). So kernels are added whenever
demand starts, and removed only where no other thread can be dispatching: when demand has
ended, this is the only Python thread (foreign threads, such as autograd's, run only inside a
backward) and it is not inside a backward. A recorder's end removes them at once where that
holds; a capture's end leaves them for the next graph replay (captures come in bursts).
Elsewhere they stay, as pass-throughs, until such a moment.

Eager callers are annotated once: inside a wrapped call (``CALLS.depth``) a kernel only
redispatches. Tracing is untouched: fake, functional and meta tensors go straight through, and
compiled graphs hold torch's own ``OpOverload`` objects (no Python object is replaced). An op
that already has a kernel for our key (someone else's) is left alone.
"""

from __future__ import annotations

import _thread
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from autoannot import collectives, diagnostics, metadata, wrappers
from autoannot.state import CALLS, STATE


@dataclass(frozen=True)
class OpFamily:
    """The ops of one torch.ops namespace, annotated by kernels on one dispatch key."""

    namespace: str
    module: str  # the table's module for these rows
    key: str  # the dispatch key the kernels go on
    thread_scoped: bool  # the key is in a call's key set only where a thread includes it


FAMILIES = (
    OpFamily("_c10d_functional", collectives.OPS, "BackendSelect", thread_scoped=False),
    OpFamily("c10d", collectives.PG_OPS, "DeferredInit", thread_scoped=True),
)
SCOPED_KEY = "DeferredInit"


class KernelRegistration:
    """Our kernels on torch's dispatcher, registered while there is demand."""

    __slots__ = ("libraries", "lingering", "ops", "registrations", "scoped", "skipped")

    def __init__(self) -> None:
        self.libraries: list[Any] = []
        self.ops: list[str] = []  # "namespace::op"
        self.skipped: dict[str, str] = {}  # namespace -> why its ops are not annotated
        self.lingering = False  # registered, no demand, waiting for a safe moment to go
        self.scoped = False  # the thread-scoped family's kernels are registered
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
            for family in FAMILIES:
                try:
                    why = _unavailable(family)
                    if why:
                        self.skipped[family.namespace] = why
                        continue
                    library, ops = _register_kernels(family)
                    self.libraries.append(library)
                    self.ops += ops
                    self.scoped = self.scoped or (family.thread_scoped and bool(ops))
                except Exception as exc:  # the collectives still run, unannotated
                    self.skipped[family.namespace] = f"{type(exc).__name__}: {exc}"
                    diagnostics.warn_once(family.namespace, "registering dispatcher kernels", exc)
            wrappers.EXCLUSION = exclusion()

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
            wrappers.EXCLUSION = None
            for library in reversed(self.libraries):
                library._destroy()
            self.libraries, self.ops, self.lingering, self.scoped = [], [], False, False
            return True

    def undo(self) -> bool:
        """(``disable()``) Remove them where that is safe; else they stay as pass-throughs.
        This thread stops carrying the thread-scoped key."""
        self.remove_if_safe()
        release_thread(enabling=True)
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
        diagnostics.warn_once("dispatcher kernels", "switching on or off", exc)


@functools.cache
def _unavailable(family: OpFamily) -> str:
    """Why this torch cannot take a family's kernels ('' if it can)."""
    import inspect

    import torch

    if "with_keyset" not in inspect.signature(torch.library.Library.impl).parameters:
        return "torch.library has no with_keyset kernels"
    if not hasattr(torch._C, "_dispatch_keyset_full_after"):
        return "torch has no _dispatch_keyset_full_after"
    if family.thread_scoped:
        import importlib

        c10d = importlib.import_module("torch.distributed.distributed_c10d")
        if not hasattr(c10d.ProcessGroup, "unbox"):
            return "ProcessGroup has no unbox()"
        if _scoped_key() is None:
            return f"the {family.key} dispatch key is taken (another library's fallback)"
    return ""


def available() -> bool:
    """Whether this torch can take a Python kernel that redispatches (``with_keyset``)."""
    try:
        return not _unavailable(FAMILIES[0])
    except Exception:
        return False


# --- the thread-scoped key ------------------------------------------------------------------

@functools.cache
def _scoped_key() -> Any:
    """The thread-scoped DispatchKey, with our fall-through for every op; None where another
    library owns the key (torchdistx registers a real fallback on it).

    The fall-through lives as long as the process, on purpose: a thread that carries the key
    without it could run no op at all ("Could not run 'aten::ones' with arguments from the
    'DeferredInit' backend"), so it must outlive interpreter shutdown, where ``Library``'s
    finalizers (and module teardown) would take it away first."""
    import ctypes
    import sys

    import torch

    key = torch._C._dispatch_key_parse(SCOPED_KEY)
    if torch._C._dispatch_has_backend_fallback(key):
        return None
    line = sys._getframe().f_lineno
    library = torch._C._dispatch_library("IMPL", "_", "", __file__, line)
    library.fallback(SCOPED_KEY, torch.library.fallthrough_kernel, False)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(library))  # never freed (see above)
    return key


class _Included(_thread._local):
    def __init__(self) -> None:
        self.enabling = False  # the agent was turned on on this thread (and is on)
        self.holds = 0  # recorders and captures in progress on this thread
        self.before = False  # the key was included before we touched it


_included = _Included()


def include_thread(enabling: bool = False) -> None:
    """Make C++-origin launches on this thread (and on the threads torch runs its work on)
    reach our kernels: include the thread-scoped key here. ``enabling``: for as long as the
    agent stays on; else for one recorder or capture (undone by ``release_thread``)."""
    key = _scoped_key_if_ready()
    if key is None:
        return
    import torch

    mine = _included
    if not mine.enabling and not mine.holds:
        mine.before = torch._C._dispatch_tls_is_dispatch_key_included(key)
    if enabling:
        mine.enabling = True
    else:
        mine.holds += 1
    torch._C._dispatch_tls_set_dispatch_key_included(key, True)


def release_thread(enabling: bool = False) -> None:
    """Undo ``include_thread`` (of a recorder or capture; ``enabling``: of turning on)."""
    mine = _included
    if enabling:
        if not mine.enabling:
            return
        mine.enabling = False
    else:
        if not mine.holds:
            return
        mine.holds -= 1
    key = _scoped_key_if_ready()
    if key is not None and not mine.enabling and not mine.holds and not mine.before:
        import torch

        torch._C._dispatch_tls_set_dispatch_key_included(key, False)


def _scoped_key_if_ready() -> Any:
    try:
        return _scoped_key() if not _unavailable(FAMILIES[1]) else None
    except Exception:
        return None


def exclusion() -> tuple[Callable[[Any, bool], None], Any] | None:
    """(set_excluded, key) while the thread-scoped kernels are registered: the proxies exclude
    the key around the call they annotate (the launch must not reach a kernel below)."""
    if not REGISTRATION.scoped:
        return None
    import torch

    return torch._C._dispatch_tls_set_dispatch_key_excluded, _scoped_key()


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
    """Listen for demand (the kernels go on when it starts: now, if it has); this thread
    carries the thread-scoped key while the agent is on."""
    from autoannot import config

    if not config.from_environment().ops or not available():
        return []
    STATE.add_demand_listener(on_demand)
    include_thread(enabling=True)
    if STATE.demand:
        REGISTRATION.register()
    return [REGISTRATION]


@functools.cache
def _kernels(family: OpFamily) -> tuple[tuple[str, str, Callable[..., Any]], ...]:
    """(op name, qualified name, kernel) for each op of the table this torch has; built once
    (each registration reuses them: a capture pays for the registration alone)."""
    import torch

    ops = getattr(torch.ops, family.namespace)
    below = torch._C._dispatch_keyset_full_after(torch._C._dispatch_key_parse(family.key))
    kernels = []
    for row in collectives.COLLECTIVES:
        if row.module != family.module:
            continue
        try:
            op = getattr(ops, row.api).default
        except AttributeError:  # not in this torch
            continue
        wrapper = wrappers.launch_wrapper(row, metadata.Plan(row, op))
        kernels.append((row.api, op.name(), _kernel(op, wrapper, below)))
    return tuple(kernels)


def _register_kernels(family: OpFamily) -> tuple[Any, list[str]]:
    import torch

    library = torch.library.Library(family.namespace, "IMPL")
    registered = []
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    for api, name, kernel in _kernels(family):
        if has_kernel(name, family.key):
            continue  # someone else's kernel: leave it
        library.impl(api, kernel, family.key, with_keyset=True)
        registered.append(name)
    return library, registered

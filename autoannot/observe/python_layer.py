"""The Python layer: launches no Python proxy sees, where the native observer is not built (no
C++ compiler): Python kernels on torch's dispatcher, reached only on threads that hold the
agent's dispatch key.

This is one of the two places the agent borrows a dispatch key (the native module's c10d
kernels, ``native/ring_kernels.cpp``, the other), because pure Python has no other way to see a
launch made from C++ (torch offers RecordFunction callbacks to C++ only; the native observer
uses them). Its blast radius is kept small:

* The key is ``DeferredInit`` (torchdistx's; torch itself never includes it). Nothing is put
  on the dispatcher at import or at ``enable()``: the first *hold* registers a fall-through
  for every other op and the kernels; once no thread has held the layer for ``GRACE_S``
  seconds the fall-through is taken off again (at once by ``disable()``). The grace keeps a
  burst of captures (an inference server's dozens of graphs, one per batch size) from paying
  for registering it each time: a fallback goes into every op's dispatch table, ~1.4 ms on
  the H200 machine, twice a capture. The kernels stay until ``disable()``, on their ops only
  (changing an op's kernel while another thread dispatches through it races in torch's
  dispatcher).
* Where another library owns the key (a fallback registered first: torchdistx does, from C++,
  when it loads), the layer steps aside, says so once, and annotates Python-API launches only.
* A thread includes the key while it holds the layer: while it captures a CUDA graph, or has
  ``record()`` open; with a journal open from the start (``AUTOANNOT_RECORD``, the always-on
  ``AUTOANNOT_RING``), the thread that imports torch until ``disable()`` (``hold_for_good``)
  and every thread the ``threading`` module starts after, for its life (``hold_new_threads``:
  threading's documented ``setprofile``, whose function runs once in each new thread and
  hands it back to the one set before). Once those holds are let go after ``disable()``, the
  kernels come off: a collective costs what it does without the agent.
  Torch carries a thread's included keys to the threads that run work for it (autograd's
  engine threads during a backward started there: DDP's reducer, backward collectives).
  Including a key on a thread is what ``torch.compile`` guards on: a function compiled outside
  such a block is compiled once more inside one. Held on every thread for good, the key is
  the same wherever a function is compiled and called: no compile more than with the agent
  off.

Two op families of the table get kernels that run the proxies' launch wrapper around a
redispatch to the keys below theirs, that is, to torch's own kernel: ``_c10d_functional``
(compiled code, funcol's autograd backward) and ``c10d`` (every ``ProcessGroup`` call).
Tracing is untouched: fake, functional and meta tensors go straight through, and compiled
graphs hold torch's own ``OpOverload`` objects.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autoannot.base import diagnostics, locks
from autoannot.describe import collectives, metadata
from autoannot.observe import wrappers


@dataclass(frozen=True)
class OpFamily:
    """The ops of one torch.ops namespace, the table rows they come from."""

    namespace: str
    module: str  # the table's module for these rows


FAMILIES = (
    OpFamily("_c10d_functional", collectives.OPS),
    OpFamily("c10d", collectives.PG_OPS),
)
KEY = "DeferredInit"
#: Seconds without a hold after which the layer gives the key back.
GRACE_S = 2.0


class _Holds(_thread._local):
    def __init__(self) -> None:
        self.count = 0  # this thread's holds (captures, recorders) in progress
        self.before = False  # the key was included before the first of them


class DispatcherLayer:
    """The agent's kernels on torch's dispatcher and the threads that reach them.

    ``hold()`` / ``release()`` on a thread: launches made on it (and on the threads torch runs
    its work on) reach the kernels in between. ``agent``: the ``Instrumentation`` (its state,
    captures)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self._lock = locks.renewed(self, "_lock", reentrant=True)
        self.libraries: list[Any] = []
        self.ops: list[str] = []  # "namespace::op" of the kernels registered
        self.skipped: dict[str, str] = {}  # namespace -> why its ops are not annotated
        self.registrations = 0  # times the kernels were put on (for doctor and tests)
        self.holders = 0  # threads holding the layer now
        self.retired = False  # disable(): take the kernels off once no thread holds them
        self.stepped_aside = ""  # why the key is not ours now ("": it is, or it is free)
        self._fallthrough: Any = None  # our fall-through on the key, while something holds
        self._holds = _Holds()
        self.grace_s = GRACE_S
        self._giving_back: Any = None  # the timer that gives the key back, once idle
        self._on_new_threads: _HoldOnStart | None = None  # threading's profile function, ours
        self._for_good: set[int] = set()  # threads holding it from start-up to ``retire()``
        self._thread_ends = threading.local()  # (a new thread's hold, let go when it ends)

    def __repr__(self) -> str:
        return f"DispatcherLayer({', '.join(self.ops) or 'no kernels'}, holders={self.holders})"

    @property
    def registered(self) -> bool:
        return bool(self.libraries)

    @property
    def fallthrough_registered(self) -> bool:
        return self._fallthrough is not None

    def hold(self) -> None:
        """Launches on this thread reach the kernels until the matching ``release()``."""
        holds = self._holds
        with self._lock:
            if holds.count == 0:
                self._cancel_giving_back()
                if self.holders == 0 and self._fallthrough is None and not self._take_key():
                    return
                if not self.libraries:
                    self._register()  # no thread includes the key: none reads these entries
                holds.before = _included()
                self.holders += 1
                self.retired = False
                self.agent.state.set_exclusion(self.exclusion)
            holds.count += 1
        _include(True)

    def release(self) -> None:
        """Undo one ``hold()`` of this thread (nothing if it holds none)."""
        holds = self._holds
        with self._lock:
            if holds.count == 0:
                return
            holds.count -= 1
            if holds.count:
                return
            _include(holds.before)
            self._holder_gone()

    def hold_for_good(self) -> None:
        """``hold()`` on this thread until ``retire()`` (a journal open from start-up: the
        thread that imports torch); once a thread however often it is asked."""
        ident = threading.get_ident()
        with self._lock:
            if ident in self._for_good:
                return
            self.hold()
            if self._holds.count:
                self._for_good.add(ident)

    def hold_new_threads(self) -> None:
        """Every thread the ``threading`` module starts from now on holds the layer for its
        life (as the thread that imported torch does, with a journal open from the start):
        where some threads included the key and others not, ``torch.compile`` would compile a
        function again for each. Through ``threading.setprofile``: its function runs at a new
        thread's first call, holds the layer there and gives the thread the profile function
        set before ours (a profiler's, as yappi sets). Until ``retire()``."""
        with self._lock:
            if self._on_new_threads is None:
                hook = _HoldOnStart(self, threading.getprofile())
                threading.setprofile(hook)
                self._on_new_threads = hook

    def hold_till_thread_ends(self) -> None:
        """``hold()`` on this new thread for its life: the hold is let go when it ends (its
        key goes with it), so the kernels come off once the threads that held them are
        gone and the agent is disabled."""
        self.hold()
        if self._holds.count:
            self._thread_ends.end = _ThreadEnd(self)

    def _thread_ended(self) -> None:
        """A thread holding the layer for its life has ended (``_ThreadEnd``)."""
        with self._lock:
            self._holder_gone()

    def _holder_gone(self) -> None:
        """(Under the lock) One thread holds the layer no more; after the last, the key goes
        back (at once once retired, with the kernels; else after the grace)."""
        self.holders -= 1
        if not self.holders:
            self.agent.state.set_exclusion(None)
            if self.retired:
                self._give_key_back()
                self._remove()
            else:
                self._give_key_back_later()

    def retire(self) -> None:
        """(``disable()``) Take the kernels off now if no thread holds the layer, else when
        the last one releases it; new threads no longer hold it."""
        with self._lock:
            self.retired = True
            hook, self._on_new_threads = self._on_new_threads, None
            if hook is not None and threading.getprofile() is hook:
                threading.setprofile(hook.previous)
            ident = threading.get_ident()
            if ident in self._for_good:  # (this thread's start-up hold: let go now; another
                self._for_good.discard(ident)  # thread's key is its own, left to it)
                self.release()
                return  # (the last holder: the kernels are off; else when it lets go)
            if not self.holders:
                self._cancel_giving_back()
                self._give_key_back()
                self._remove()

    @property
    def exclusion(self) -> Any:
        """Our key excluded around a call the wrappers annotate."""
        import torch

        return wrappers.Exclusion(torch._C._dispatch_tls_set_dispatch_key_excluded, _key())

    def _take_key(self) -> bool:
        """Register our fall-through on the key; False (said once) where another library
        owns it."""
        import sys

        import torch

        key = _key()
        if torch._C._dispatch_has_backend_fallback(key):
            self.stepped_aside = (f"the {KEY} dispatch key has another owner (a fallback "
                                  "registered by another library, such as torchdistx)")
            diagnostics.say_once("dispatch:stepped-aside", f"autoannot: {self.stepped_aside}: "
                                 "launches made from C++ (DDP's reducer, compiled code) are "
                                 "not annotated; the Python API's are. Build the native "
                                 "observer (autoannot build-native), which needs no key.")
            return False
        self.stepped_aside = ""
        library = torch._C._dispatch_library("IMPL", "_", "", __file__,
                                             sys._getframe().f_lineno)
        library.fallback(KEY, torch.library.fallthrough_kernel, False)
        # Held past interpreter shutdown while registered: a thread that carries the key
        # without it could run no op at all ("Could not run 'aten::ones' with arguments from
        # the 'DeferredInit' backend"), and module teardown would free it first.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(library))
        self._fallthrough = library
        return True

    def _give_key_back_later(self) -> None:
        """The key goes back once no thread held the layer for ``grace_s`` seconds."""
        if self.grace_s <= 0:
            self._give_key_back()
            return
        timer = threading.Timer(self.grace_s, self._give_key_back_if_idle)
        timer.daemon = True
        self._giving_back = timer
        timer.start()

    def _cancel_giving_back(self) -> None:
        timer, self._giving_back = self._giving_back, None
        if timer is not None:
            timer.cancel()

    def _give_key_back_if_idle(self) -> None:
        with self._lock:
            if self.holders == 0 and self._giving_back is not None:
                self._giving_back = None
                self._give_key_back()

    def _give_key_back(self) -> None:
        library, self._fallthrough = self._fallthrough, None
        if library is not None:
            try:
                library.reset()
            except Exception as exc:
                diagnostics.warn_once("dispatcher layer", "releasing its dispatch key", exc)
            ctypes.pythonapi.Py_DecRef(ctypes.py_object(library))

    def _register(self) -> None:
        self.registrations += 1
        for family in FAMILIES:
            try:
                why = unavailable(family)
                if why:
                    self.skipped[family.namespace] = why
                    continue
                library, ops = _register_kernels(family, self.agent)
                self.libraries.append(library)
                self.ops += ops
            except Exception as exc:  # the collectives still run, unannotated
                self.skipped[family.namespace] = f"{type(exc).__name__}: {exc}"
                diagnostics.warn_once(family.namespace, "registering dispatcher kernels", exc)

    def _remove(self) -> None:
        self.agent.state.set_exclusion(None)
        libraries, self.libraries, self.ops = self.libraries, [], []
        for library in reversed(libraries):
            try:
                library._destroy()
            except Exception as exc:
                diagnostics.warn_once("dispatcher kernels", "removing", exc)


class _ThreadEnd:
    """Kept in a thread's locals while it holds the layer for its life: freed as the thread
    ends, it tells the layer (``_thread_ended``)."""

    __slots__ = ("layer",)

    def __init__(self, layer: DispatcherLayer) -> None:
        self.layer = layer

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # (at interpreter shutdown: nothing to tell)
            self.layer._thread_ended()


class _HoldOnStart:
    """``threading``'s profile function while new threads hold the layer
    (``DispatcherLayer.hold_new_threads``): at a new thread's first call it hands the thread
    to ``previous`` (the profile function set before: none, or a profiler's), holds the layer
    there for good and passes the call on."""

    __slots__ = ("layer", "previous")

    def __init__(self, layer: DispatcherLayer, previous: Any) -> None:
        self.layer, self.previous = layer, previous

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        import sys

        previous = self.previous
        sys.setprofile(previous)
        try:
            self.layer.hold_till_thread_ends()
        except Exception as exc:  # the thread runs unheld: said once
            diagnostics.warn_once("dispatcher layer", "holding it on a new thread", exc)
        if previous is not None:
            return previous(frame, event, arg)
        return None


def _included() -> bool:
    import torch

    return torch._C._dispatch_tls_is_dispatch_key_included(_key())


def _include(included: bool) -> None:
    import torch

    torch._C._dispatch_tls_set_dispatch_key_included(_key(), included)


@functools.cache
def unavailable(family: OpFamily) -> str:
    """Why this torch cannot take a family's kernels ('' if it can)."""
    import inspect

    import torch

    if "with_keyset" not in inspect.signature(torch.library.Library.impl).parameters:
        return "torch.library has no with_keyset kernels"
    if not hasattr(torch._C, "_dispatch_keyset_full_after"):
        return "torch has no _dispatch_keyset_full_after"
    if family.module == collectives.PG_OPS:
        import importlib

        c10d = importlib.import_module("torch.distributed.distributed_c10d")
        if not hasattr(c10d.ProcessGroup, "unbox"):
            return "ProcessGroup has no unbox()"
    return ""


def available() -> bool:
    """Whether this torch can take a Python kernel that redispatches (``with_keyset``)."""
    try:
        return not unavailable(FAMILIES[0])
    except Exception:
        return False


@functools.cache
def _key() -> Any:
    import torch

    return torch._C._dispatch_key_parse(KEY)


def _real_tensor_check() -> Callable[[tuple, dict], bool]:
    import torch

    plain = (torch.Tensor, torch.nn.Parameter)

    def is_real(args: tuple, kwargs: dict) -> bool:
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


def _kernel(op: Any, wrapper: wrappers.Wrapper, below: Any, state: Any) -> Callable[..., Any]:
    handle = getattr(op, "_handle", None)  # OpOverload.redispatch is a Python hop to this
    redispatch = getattr(handle, "redispatch_boxed", None) or op.redispatch
    partial = functools.partial
    inside = state.inside  # (see State.inside)
    get_ident = _thread.get_ident

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # see wrappers.py
        if state.demand and get_ident() not in inside:
            return wrapper(partial(redispatch, keyset & below), None, args, kwargs)
        return redispatch(keyset & below, *args, **kwargs)

    kernel.__name__ = f"autoannot_{op.__name__.replace('.', '_')}"
    return kernel


def _kernels(family: OpFamily, agent: Any) -> tuple[tuple[str, str, Callable[..., Any]], ...]:
    """(op name, qualified name, kernel) for each op of the table this torch has."""
    import torch

    ops = getattr(torch.ops, family.namespace)
    below = torch._C._dispatch_keyset_full_after(_key())
    kernels = []
    for row in collectives.COLLECTIVES:
        if row.module != family.module:
            continue
        try:
            op = getattr(ops, row.api).default
        except AttributeError:  # not in this torch
            continue
        wrapper = wrappers.launch_wrapper(row, metadata.Plan(row, op), agent,
                                          _real_tensor_check())
        kernels.append((row.api, op.name(), _kernel(op, wrapper, below, agent.state)))
    return tuple(kernels)


def _register_kernels(family: OpFamily, agent: Any) -> tuple[Any, list[str]]:
    import torch

    library = torch.library.Library(family.namespace, "IMPL")
    registered = []
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    for api, name, kernel in _kernels(family, agent):
        if has_kernel(name, KEY):
            continue  # someone else's kernel: leave it
        library.impl(api, kernel, KEY, with_keyset=True)
        registered.append(name)
    return library, registered


def create(agent: Any) -> DispatcherLayer | None:
    """The layer, where ``AUTOANNOT_OPS`` is on and this torch can take it; else None. Nothing
    is put on the dispatcher until a thread first holds it."""
    if not agent.config.ops or not available():
        return None
    return DispatcherLayer(agent)

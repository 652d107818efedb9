"""Launches no Python proxy sees: Python kernels on torch's dispatcher, reached only on threads
that hold the agent's dispatch key.

Two op families of the table get kernels that run the proxies' launch wrapper around a
redispatch to the keys below theirs, that is, to torch's own kernel:

* ``torch.ops._c10d_functional`` (what compiled code, and funcol's autograd backward, launch);
* ``torch.ops.c10d`` (what every ``ProcessGroup`` call dispatches through: DDP's reducer,
  autograd's engine threads, C++ extensions, ``pg.allreduce(...)``, ``dist.*`` below the
  proxies).

Both are on ``DeferredInit``, a key in no call's key set unless the calling thread includes it
(torchdistx's key; torch itself never includes it; the agent registers a fall-through for
every other op). A thread includes it while it *holds* the layer: while it captures a CUDA
graph, or has ``record(dispatcher=True)`` open. Torch carries a thread's included keys to the
threads that run work for it (autograd's engine threads during a backward started there:
DDP's reducer, backward collectives). Every other thread, and every thread when nothing is
annotated, never reaches the kernels: they cost nothing, whatever threads the process has.

Why the key, not registering and removing kernels as demand comes and goes: changing an op's
kernel while another thread dispatches through it is a data race in torch's dispatcher
(measured: 2 internal asserts in 294 removals, 4 threads dispatching). Here the kernels are
registered once, at the first hold, when no thread includes the key (so none can be reading
their table entries), and removed only by ``disable()`` when no thread holds it. Including a
key on a thread is what torch.compile guards on (a compiled function called where the key is
included is compiled again): so the key is included only inside captures and
``record(dispatcher=True)`` blocks, never for a plain ``record()``, never for good.

The proxies exclude the key around the call they annotate, so a Python-API launch is
annotated once and does not pay for a Python kernel below (~20 us on a ``c10d::`` op: its
ProcessGroup goes through the dispatcher as a ScriptObject). Tracing is untouched: fake,
functional and meta tensors go straight through, and compiled graphs hold torch's own
``OpOverload`` objects (no Python object is replaced). An op that already has a kernel for our
key (someone else's) is left alone.
"""

from __future__ import annotations

import _thread
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autoannot import collectives, diagnostics, groups, locks, metadata, wrappers
from autoannot.state import CALLS, STATE


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


class _Holds(_thread._local):
    def __init__(self) -> None:
        self.count = 0  # this thread's holds (captures, dispatcher recorders) in progress
        self.before: tuple[bool, bool] = (False, False)  # our key and the native one were
        # included before the first of them


class DispatcherLayer:
    """The agent's kernels on torch's dispatcher and the threads that reach them.

    ``hold()`` / ``release()`` on a thread: launches made on it (and on the threads torch runs
    its work on) reach the kernels in between. Created by ``enable()`` when torch loads (with
    ``AUTOANNOT_OPS`` on and a torch that can take such kernels); owned by the agent's
    ``Instrumentation``; captures and recorders get it from there."""

    def __init__(self) -> None:
        self._lock = locks.renewed(self, "_lock", reentrant=True)
        self.libraries: list[Any] = []
        self.ops: list[str] = []  # "namespace::op" of the kernels registered
        self.skipped: dict[str, str] = {}  # namespace -> why its ops are not annotated
        self.registrations = 0  # times the kernels were put on (for doctor and tests)
        self.holders = 0  # threads holding the layer now
        self.retired = False  # disable(): take the kernels off once no thread holds them
        self._holds = _Holds()
        #: ``(set_excluded, key)`` once kernels are registered; ``STATE.exclusion`` while some
        #: thread holds the layer.
        #: The third: the native kernel's ``call_excluded(function, args, kwargs)`` where it
        #: is loaded (one call instead of two toggles), else None.
        self.exclusion: tuple[Callable[[Any, bool], None], Any, Any] | None = None
        #: The native kernel's module (``autoannot.native``) where it is built and its kernels
        #: are on; its key is included and excluded with ours.
        self.native: Any = None
        self.native_ops: list[str] = []

    def __repr__(self) -> str:
        return f"DispatcherLayer({', '.join(self.ops) or 'no kernels'}, holders={self.holders})"

    @property
    def registered(self) -> bool:
        return bool(self.libraries)

    def hold(self) -> None:
        """Launches on this thread reach the kernels until the matching ``release()``."""
        holds = self._holds
        with self._lock:
            if holds.count == 0:
                key = _key()
                if key is None:
                    return
                if not self.libraries:
                    self._register()  # no thread includes the key: none reads these entries
                holds.before = _included(key, self.native)
                self.holders += 1
                self.retired = False
                STATE.exclusion = self.exclusion
                STATE.set_native(self.native)
            holds.count += 1
        _include(_key(), self.native, True)

    def release(self) -> None:
        """Undo one ``hold()`` of this thread (nothing if it holds none)."""
        holds = self._holds
        with self._lock:
            if holds.count == 0:
                return
            holds.count -= 1
            if holds.count:
                return
            self.holders -= 1
            if not self.holders:
                STATE.exclusion = None
                STATE.set_native(None)
            _include(_key(), self.native, holds.before)
            if self.retired and not self.holders:
                self._remove()

    def retire(self) -> None:
        """(``disable()``) Take the kernels off now if no thread holds the layer, else when
        the last one releases it. The key's fall-through stays (see ``_key``)."""
        with self._lock:
            self.retired = True
            if not self.holders:
                self._remove()

    def _register(self) -> None:
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
            except Exception as exc:  # the collectives still run, unannotated
                self.skipped[family.namespace] = f"{type(exc).__name__}: {exc}"
                diagnostics.warn_once(family.namespace, "registering dispatcher kernels", exc)
        if self.ops:
            import torch

            self._register_native([op for op in self.ops if op.startswith("c10d::")])
            self.exclusion = (torch._C._dispatch_tls_set_dispatch_key_excluded, _key(),
                              getattr(self.native, "call_excluded", None))

    def _register_native(self, ops: list[str]) -> None:
        """The native kernel for the ``c10d::`` ops, where it is built (see autoannot.native)."""
        from autoannot import native

        module = native.load()
        if module is None or not ops:
            return
        try:
            import torch

            key = torch._C._dispatch_key_parse(module.KEY)
            if torch._C._dispatch_has_backend_fallback(key) and not module.registered():
                self.skipped["native"] = f"the {module.KEY} dispatch key is taken"
                return
            plans = _note_plans()
            self.native_ops = module.register_kernels(ops, [plans[op][3] for op in ops])
            self.native = module
            # a group gone: its address may be reused, the kernel's launches get new kinds
            groups.on_group_gone(module.forget_kinds)
        except Exception as exc:  # the Python kernels annotate these launches
            self.skipped["native"] = f"{type(exc).__name__}: {exc}"
            diagnostics.warn_once("native kernel", "registering", exc)

    def _remove(self) -> None:
        self.exclusion = STATE.exclusion = None
        STATE.set_native(None)
        if self.native is not None:
            self.native.remove_kernels()
            self.native, self.native_ops = None, []
        libraries, self.libraries, self.ops = self.libraries, [], []
        for library in reversed(libraries):
            try:
                library._destroy()
            except Exception as exc:
                diagnostics.warn_once("dispatcher kernels", "removing", exc)


def _included(key: Any, native: Any) -> tuple[bool, bool]:
    """Whether this thread includes our key, and the native kernel's (before a hold)."""
    import torch

    included = torch._C._dispatch_tls_is_dispatch_key_included
    return (included(key),
            included(torch._C._dispatch_key_parse(native.KEY)) if native is not None else False)


def _include(key: Any, native: Any, included: bool | tuple[bool, bool]) -> None:
    """Include (or, with what ``_included`` said before, restore) our key and the native one."""
    import torch

    ours, theirs = (included, included) if type(included) is bool else included
    torch._C._dispatch_tls_set_dispatch_key_included(key, ours)
    if native is not None:
        torch._C._dispatch_tls_set_dispatch_key_included(
            torch._C._dispatch_key_parse(native.KEY), theirs)


@functools.cache
def _unavailable(family: OpFamily) -> str:
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
    if _key() is None:
        return f"the {KEY} dispatch key is taken (another library's fallback)"
    return ""


def available() -> bool:
    """Whether this torch can take a Python kernel that redispatches (``with_keyset``)."""
    try:
        return not _unavailable(FAMILIES[0])
    except Exception:
        return False


@functools.cache
def _key() -> Any:
    """The DispatchKey, with our fall-through for every op; None where another library owns
    the key (torchdistx registers a real fallback on it).

    The fall-through lives as long as the process, on purpose: a thread that carries the key
    without it could run no op at all ("Could not run 'aten::ones' with arguments from the
    'DeferredInit' backend"), so it must outlive interpreter shutdown, where ``Library``'s
    finalizers (and module teardown) would take it away first."""
    import ctypes
    import sys

    import torch

    key = torch._C._dispatch_key_parse(KEY)
    if torch._C._dispatch_has_backend_fallback(key):
        return None
    line = sys._getframe().f_lineno
    library = torch._C._dispatch_library("IMPL", "_", "", __file__, line)
    library.fallback(KEY, torch.library.fallthrough_kernel, False)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(library))  # never freed (see above)
    return key


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


def _kernel(op: Any, wrapper: wrappers.Wrapper, below: Any) -> Callable[..., Any]:
    handle = getattr(op, "_handle", None)  # OpOverload.redispatch is a Python hop to this
    redispatch = getattr(handle, "redispatch_boxed", None) or op.redispatch
    partial = functools.partial

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # see wrappers.py
        if STATE.demand and not CALLS.depth:
            return wrapper(partial(redispatch, keyset & below), None, args, kwargs)
        return redispatch(keyset & below, *args, **kwargs)

    kernel.__name__ = f"autoannot_{op.__name__.replace('.', '_')}"
    return kernel


@functools.cache
def _kernels(family: OpFamily) -> tuple[tuple[str, str, Callable[..., Any]], ...]:
    """(op name, qualified name, kernel) for each op of the table this torch has."""
    import torch

    ops = getattr(torch.ops, family.namespace)
    below = torch._C._dispatch_keyset_full_after(torch._C._dispatch_key_parse(KEY))
    kernels = []
    for row in collectives.COLLECTIVES:
        if row.module != family.module:
            continue
        try:
            op = getattr(ops, row.api).default
        except AttributeError:  # not in this torch
            continue
        wrapper = wrappers.launch_wrapper(row, metadata.Plan(row, op), _real_tensor_check())
        kernels.append((row.api, op.name(), _kernel(op, wrapper, below)))
    return tuple(kernels)


def _register_kernels(family: OpFamily) -> tuple[Any, list[str]]:
    import torch

    library = torch.library.Library(family.namespace, "IMPL")
    registered = []
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    for api, name, kernel in _kernels(family):
        if has_kernel(name, KEY):
            continue  # someone else's kernel: leave it
        library.impl(api, kernel, KEY, with_keyset=True)
        registered.append(name)
    return library, registered


def create() -> DispatcherLayer | None:
    """The layer, where ``AUTOANNOT_OPS`` is on and this torch can take it; else None. Nothing
    is put on the dispatcher until a thread first holds it."""
    from autoannot import config

    if not config.from_environment().ops or not available():
        return None
    return DispatcherLayer()


@functools.cache
def _note_plans() -> dict[str, tuple[str, metadata.Plan, tuple[str, ...], list[int]]]:
    """``"c10d::op"`` -> (label, plan, names of its keyword-only arguments, positions of the
    arguments its launch's metadata is read from), for the native kernel's notes."""
    import torch

    plans = {}
    for row in collectives.COLLECTIVES:
        if row.module != collectives.PG_OPS:
            continue
        try:
            op = getattr(torch.ops.c10d, row.api).default
        except AttributeError:  # not in this torch
            continue
        arguments = [arg.name for arg in op._schema.arguments]
        read = {row.group_param, row.inputs, row.outputs, *row.root_params, *row.split_params}
        keyword_only = tuple(arg.name for arg in op._schema.arguments if arg.kwarg_only)
        plans[op.name()] = (row.label, metadata.Plan(row, op), keyword_only,
                            [i for i, name in enumerate(arguments) if name in read])
    return plans


#: kind of noted launch (the native kernel's number, never reused) -> (label, annotation,
#: kernels, launch), or None where it could not be derived; (kind, label) -> the same, named by
#: a proxy's label. A kind names one group for good (the kernel forgets its kinds when a group
#: is gone), so this is kept when groups go; let go, with the kernel's kinds, when it is large
#: and no note is waiting.
_KINDS: dict[Any, tuple | None] = {}


def launched_of_notes(native: Any, capture: int) -> list[tuple]:
    """The native kernel's notes of one capture as a ledger's launches ``(label, annotation,
    kernels, call site, order)``: each kind of launch derived once, by its row's plan, as the
    Python kernel derives a launch (tensors stand in as their dtype and sizes). A launch a
    proxy handed off carries the proxy's label and call site: its annotation is the kind's,
    named by that label (once per kind and label). A note that cannot be derived is left out,
    and said once."""
    from autoannot import recorder

    kinds = _KINDS
    plans = _note_plans()
    launched = []
    native_site = recorder.NATIVE_CALLER
    for order, name, kind, noted, label, site in native.drain(capture):
        found = kinds.get(kind) if noted is None else None
        if found is None and noted is not None:
            found = _derive_note(plans, name, noted)
            if kind:
                kinds[kind] = found
        if found is None:
            continue
        if label is not None and label != found[0]:
            relabeled = kinds.get((kind, label)) if kind else None
            if relabeled is None:
                relabeled = (label, metadata.annotation_of(label, found[3]), *found[2:])
                if kind:
                    kinds[(kind, label)] = relabeled
            found = relabeled
        launched.append((*found[:3], native_site if site is None else site, order))
    if len(kinds) >= wrappers.CACHE_SIZE and native.forget_kinds(if_idle=True):
        kinds.clear()  # (no note waits for a kind: the kernel knows them anew)
    return launched


def _derive_note(plans: dict[str, Any], name: str, noted: tuple) -> tuple | None:
    from autoannot import native

    label, plan, keyword_only, _ = plans.get(name, (name, None, (), []))
    try:
        if plan is None:
            raise LookupError(f"{name} is not in the table")
        args = [native.stand_in(value) for value in noted]
        split = len(args) - len(keyword_only)
        launch = plan.derive(tuple(args[:split]),
                             dict(zip(keyword_only, args[split:], strict=True)))
    except Exception as exc:  # this launch goes unannotated
        diagnostics.warn_once(label, "deriving the collective metadata", exc)
        return None
    return label, metadata.annotation_of(label, launch), launch.kernels, launch

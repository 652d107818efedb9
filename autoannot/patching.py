"""enable() / disable(): put wrapt proxies in every namespace that holds a collective, and take
them out again, restoring the original objects by identity.

Importing this module does not import torch: when torch.distributed is not imported yet,
``enable()`` registers post-import hooks and patches as soon as it is.
"""

from __future__ import annotations

import sys

from autoannot import importhook, locks
from autoannot.state import STATE

TYPE_CHECKING = False  # typing is not imported at start-up: it costs milliseconds
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

_lock = locks.renewed(sys.modules[__name__], "_lock", reentrant=True)

#: Modules whose import triggers instrumentation, and the modules that instrument each
#: (``install(module, instrumentation)`` -> the patches it made).
HOOKED_MODULES = {
    # The dispatcher layer (compiled code's ops, C++-origin launches): once torch has
    # finished importing (torch.distributed may be imported halfway through it).
    "torch": ("autoannot.patching",),
    "torch.distributed.distributed_c10d": ("autoannot.patching",),  # the collectives
    "torch.distributed._functional_collectives": ("autoannot.patching",),
    "torch.cuda.graphs": ("autoannot.capture",),  # captures, replays, ledgers
    "torch.profiler.profiler": ("autoannot.export",),  # ledger files next to exported traces
}


class Patch:
    """One attribute we replaced: ``setattr(owner, name, replacement)`` over ``original``."""

    __slots__ = ("name", "original", "owner", "replacement")

    def __init__(self, owner: Any, name: str, original: Any, replacement: Any) -> None:
        self.owner = owner  # a module or a class
        self.name = name
        self.original = original
        self.replacement = replacement

    def __repr__(self) -> str:
        owner = getattr(self.owner, "__name__", self.owner)
        return f"Patch({owner}.{self.name})"

    def current(self) -> Any:
        namespace = self.owner.__dict__
        return namespace.get(self.name)

    def undo(self) -> bool:
        """Restore the original unless someone replaced our proxy since (then leave theirs)."""
        if self.current() is self.replacement:
            setattr(self.owner, self.name, self.original)
            return True
        return False


class ProxyCache:
    """The one proxy made for each original object (functions, methods), reused across
    enable/disable cycles: ``disable()`` restores the original, ``enable()`` the same proxy."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Any, Any]] = {}  # id(original) -> (original, proxy)

    def get(self, original: Any) -> Any:
        """The proxy made for ``original``, or None."""
        entry = self._entries.get(id(original))
        return entry[1] if entry is not None and entry[0] is original else None

    def put(self, original: Any, proxy: Any) -> Any:
        self._entries[id(original)] = (original, proxy)
        return proxy

    def is_proxy(self, obj: Any) -> bool:
        """Whether ``obj`` is one of the proxies made here."""
        wrapped = getattr(obj, "__wrapped__", None)
        return wrapped is not None and self.get(wrapped) is obj

    def originals_by_proxy_id(self) -> dict[int, Any]:
        return {id(proxy): original for original, proxy in self._entries.values()}


class Instrumentation:
    """What the agent puts in a process, owned in one place (as an OpenTelemetry instrumentor
    owns its instrument/uninstrument): the patches in place, the proxies, and the dispatcher
    layer (created when torch loads; captures and recorders take it from here)."""

    def __init__(self) -> None:
        self.patches: list[Patch] = []
        self.proxies = ProxyCache()
        self.dispatcher: Any = None  # dispatch.DispatcherLayer, once torch is loaded


INSTRUMENTATION = Instrumentation()
_patches = INSTRUMENTATION.patches
PROXIES = INSTRUMENTATION.proxies


def proxies_of(original: Any) -> list[Any]:
    """The proxies we made for an original function (none or one)."""
    proxy = PROXIES.get(original)
    return [] if proxy is None else [proxy]


def is_enabled() -> bool:
    """Whether the agent is on (collectives are patched as soon as their module is imported)."""
    return STATE.live


def enable() -> None:
    """Wrap every collective now, or as soon as torch.distributed is imported. Idempotent."""
    with _lock:
        if STATE.live:
            return
        STATE.set_live(True)
        _guarded(_install_partial_reducer, "installing", "functools.partial pickling")
        for module_name in HOOKED_MODULES:
            importhook.when_imported(module_name, _on_import)


def disable() -> None:
    """Restore every original object. A proxy someone else wrapped over stays in their chain,
    as a pass-through. Idempotent."""
    with _lock:
        if not STATE.live:
            return
        STATE.set_live(False)
        for patch in reversed(_patches):
            _guarded(patch.undo, "restoring", patch)
        _patches.clear()
        _guarded(_unbind_proxies_everywhere, "restoring module bindings", "disable")
        if INSTRUMENTATION.dispatcher is not None:
            _guarded(INSTRUMENTATION.dispatcher.retire, "removing", "dispatcher kernels")
        if "autoannot.proxies" in sys.modules:
            _guarded(sys.modules["autoannot.proxies"].remove_partial_reducer, "removing",
                     "functools.partial pickling")


def _install_partial_reducer() -> None:
    """Partials made before ``enable()`` over a collective pickle while the agent is on (see
    proxies.py); imported with the first proxy, not at start-up (it needs wrapt)."""
    importhook.when_imported("autoannot.proxies",
                             lambda module: module.install_partial_reducer(PROXIES.get))


def _guarded(step: Any, what: str, subject: Any) -> None:
    """Run one step of ``disable()``; a failure is said once and the other steps still run."""
    try:
        step()
    except Exception as exc:
        from autoannot import diagnostics

        diagnostics.warn_once(str(subject), what, exc)


def _unbind_proxies_everywhere() -> None:
    """Modules that copied a proxy after we patched (``from ... import *`` at torch's import,
    a user's ``from torch.distributed import all_reduce``) get the original back too."""
    from autoannot import collectives

    originals = PROXIES.originals_by_proxy_id()
    names = {row.api for row in collectives.COLLECTIVES if row.module not in collectives.OP_MODULES}
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name in names:
            bound = namespace.get(name)
            if bound is not None and id(bound) in originals and _is_our_proxy(bound):
                setattr(module, name, originals[id(bound)])


def _on_import(module: ModuleType) -> None:
    with _lock:
        if not STATE.live:
            return
        for installer in HOOKED_MODULES[module.__name__]:
            try:
                if installer != __name__:
                    import importlib

                    _patches.extend(
                        importlib.import_module(installer).install(module, INSTRUMENTATION))
                elif module.__name__ == "torch":
                    _create_dispatcher_layer()
                else:
                    _install_module(module)
            except Exception as exc:  # never break the import of torch
                from autoannot import diagnostics

                diagnostics.warn_once(module.__name__, f"instrumenting ({installer})", exc)


def _create_dispatcher_layer() -> None:
    """When torch loads. An ``AUTOANNOT_RECORD`` file open by then takes every launch of the
    thread importing torch (the main thread) and of the threads it runs its work on (DDP's
    reducer, backward collectives): that thread holds the layer for good."""
    if INSTRUMENTATION.dispatcher is not None:
        INSTRUMENTATION.dispatcher.retired = False  # on again: its kernels stay
        return
    from autoannot import dispatch

    layer = INSTRUMENTATION.dispatcher = dispatch.create()
    if layer is not None and STATE.journals:
        layer.hold()


def _install_module(module: ModuleType) -> None:
    from autoannot import collectives, metadata

    rows = [row for row in collectives.COLLECTIVES if row.module == module.__name__]
    replacements: dict[str, tuple[Any, Any, Any]] = {}
    for row in rows:
        original = module.__dict__.get(row.api)
        if original is None or _is_our_proxy(original):
            continue
        plan = metadata.Plan(row, original)
        proxy = _proxy_for(original, row, plan)
        replacements[row.api] = (
            original, proxy, lambda obj, row=row, plan=plan: _proxy_for(obj, row, plan)
        )
    _replace_everywhere(replacements)
    if module.__name__ == collectives.C10D:
        _patches.extend(_install_p2p_op(module))


def _is_our_proxy(obj: Any) -> bool:
    return PROXIES.is_proxy(obj)


def _proxy_for(original: Any, row: Any, plan: Any) -> Any:
    import functools

    from autoannot import proxies, wrappers
    from autoannot.collectives import Role

    proxy = PROXIES.get(original)
    if proxy is not None:
        return proxy
    wrapper = _handing_off(row, wrappers.WRAPPER_FACTORIES[row.role](row, plan))
    # The fast path: wrapt's C code asks ``enabled`` (a C-level callable, no Python frame) and,
    # while nothing wants annotations, calls the original itself. The wrapper never runs, so
    # no frame of ours sits between the caller and torch (warnings keep their stack levels).
    enabled = None if row.role is Role.BATCH else functools.partial(getattr, STATE, "demand")
    return PROXIES.put(original, proxies.CollectiveProxy(original, wrapper, enabled=enabled))


def _handing_off(row: Any, wrapper: Any) -> Any:
    """A ``torch.distributed`` launch's wrapper, as the native kernel's C function where it is
    built: in a capture it hands the launch to the kernel (label and call site kept, no Python
    frame of ours), else it calls ``wrapper`` (see autoannot.native)."""
    from autoannot import collectives, config, native
    from autoannot.collectives import Role

    if row.module != collectives.C10D or row.role is not Role.LAUNCH:
        return wrapper
    if not config.from_environment().ops:  # no dispatcher layer: no kernel to hand them to
        return wrapper
    module = native.load()
    if module is None:
        return wrapper
    return module.handoff_wrapper(wrapper, row.label, wrapper.note_in_capture)


def _wraps(obj: Any, original: Any) -> bool:
    """Whether ``obj`` is someone else's wrapper (``__wrapped__`` chain) around ``original``."""
    for _ in range(16):
        obj = getattr(obj, "__wrapped__", None)
        if obj is None:
            return False
        if obj is original:
            return True
    return False


def _replace_everywhere(replacements: dict[str, tuple[Any, Any, Any]]) -> None:
    """Swap each original for its proxy in every loaded module that binds it under its name.
    A module that binds someone else's wrapper of it gets our proxy over that wrapper."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, (original, proxy, make_proxy) in replacements.items():
            bound = namespace.get(name)
            if bound is original:
                setattr(module, name, proxy)
                _patches.append(Patch(module, name, original, proxy))
            elif bound is not None and not _is_our_proxy(bound) and _wraps(bound, original):
                theirs = make_proxy(bound)
                setattr(module, name, theirs)
                _patches.append(Patch(module, name, bound, theirs))


def _install_p2p_op(c10d: ModuleType) -> list[Patch]:
    """P2POp keeps the original isend/irecv, so P2POps outlive disable(); batch_isend_irecv's
    wrapper hands torch copies that name what c10d's module holds."""
    import wrapt

    p2p_op = getattr(c10d, "P2POp", None)
    init = p2p_op.__dict__.get("__init__") if p2p_op is not None else None
    if init is None or _is_our_proxy(init):
        return []

    def unwrap_op(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if args and _is_our_proxy(args[0]):
            args = (args[0].__wrapped__, *args[1:])
        elif _is_our_proxy(kwargs.get("op")):
            kwargs = {**kwargs, "op": kwargs["op"].__wrapped__}
        return wrapped(*args, **kwargs)

    proxy = PROXIES.get(init) or PROXIES.put(init, wrapt.FunctionWrapper(init, unwrap_op))
    p2p_op.__init__ = proxy
    return [Patch(p2p_op, "__init__", init, proxy)]


def installed() -> list[Patch]:
    """The patches in place now (for tests and ``autoannot doctor``)."""
    with _lock:
        return list(_patches)

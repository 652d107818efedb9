"""The agent's one owner: ``Instrumentation`` holds the configuration (read when it is
enabled), the state the wrappers read, the patches in place and their proxies, the launch
observers and the capture ledgers; ``enable()``/``disable()`` are thin functions over the one
instance (the shape of an OpenTelemetry instrumentor's instrument/uninstrument).

The parts below it never import it: they are handed the instance (``agent``) and read what they
need from it. Importing this module imports neither torch nor wrapt: when torch.distributed is
not imported yet, ``enable()`` registers post-import hooks and instruments it as soon as it is.
"""

from __future__ import annotations

from autoannot.agent import patching
from autoannot.agent.state import State
from autoannot.base import config, importhook, locks

TYPE_CHECKING = False  # typing is not imported at start-up: it costs milliseconds
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

_UNSET = object()


class Instrumentation:
    """What the agent puts in a process, owned in one place. See the module docstring."""

    def __init__(self) -> None:
        self._lock = locks.renewed(self, "_lock", reentrant=True)
        self.config = config.Config()  # read from the environment by enable()
        self.state = State()
        self.patches: list[patching.Patch] = []
        self.proxies = patching.ProxyCache()
        #: The native observer (``observer.NativeObserver``) once torch is loaded, where it is
        #: built and allowed; else None.
        self.observer: Any = None
        #: torch's process-group hooks (``group_hooks.HookObserver``), where torch has them
        #: (>= 2.14): then the one observer of launches below the Python API.
        self.hooks: Any = None
        #: The proxies' launches written to the ring by the native module's C wrappers
        #: (``native_ring.ProxiesRing``), once those wrappers are made; else None.
        self.native_ring: Any = None
        self._captures: Any = None
        self._windows: Any = None
        self._layer: Any = _UNSET  # the Python layer (``python_layer.DispatcherLayer``), once made
        self._native_module: Any = _UNSET
        self._proxies_module: Any = _UNSET

    def __repr__(self) -> str:
        return (f"Instrumentation(live={self.state.live}, patches={len(self.patches)}, "
                f"observer={self.observer!r}, layer={self.layer!r})")

    @property
    def captures(self) -> Any:
        """``keep.captures.Captures``: the ledgers and what a capture's begin and end do."""
        captures = self._captures
        if captures is None:
            from autoannot.keep.captures import Captures

            with self._lock:
                if self._captures is None:
                    self._captures = Captures(self)
                    self.state.set_graphs(self._captures)
                captures = self._captures
        return captures

    @property
    def windows(self) -> Any:
        """``keep.window.Windows``: the launches of the profilers' windows, held in memory."""
        windows = self._windows
        if windows is None:
            from autoannot.keep.window import Windows

            with self._lock:
                if self._windows is None:
                    self._windows = Windows(self)
                windows = self._windows
        return windows

    @property
    def layer(self) -> Any:
        """The Python layer if it was made (None otherwise)."""
        return None if self._layer is _UNSET else self._layer

    def group_hooks_observe(self) -> bool:
        """Whether torch's process-group hooks are this process's observer of launches below
        the Python API (``group_hooks.observe``). Then neither older observer is made."""
        from autoannot.observe import group_hooks

        return group_hooks.observe(self.config)

    def native_module(self) -> Any:
        """The native observer's module where it is built for this torch and allowed (looked
        for once a process); None otherwise, and where the process-group hooks observe."""
        if self._native_module is _UNSET:
            module = None
            if self.config.native and self.config.ops and not self.group_hooks_observe():
                from autoannot import native

                try:
                    module = native.load()
                except Exception as exc:  # the Python layer annotates these launches instead
                    from autoannot.base import diagnostics

                    diagnostics.warn_once("native observer", "loading", exc)
            self._native_module = module
        return self._native_module

    def proxies_native_module(self) -> Any:
        """The native module whose C function wraps the Python API's launches (the native
        observer's, or the native hooks'), with its ring path set up; None without one."""
        if self._proxies_module is not _UNSET:  # (asked for every proxy: looked for once,
            return self._proxies_module  # as a module's lookup hashes its sources)
        module = self.native_module() or self.hooks_native_module()
        if module is None or not hasattr(module, "set_proxies_ring"):
            module = None
        with self._lock:
            if module is not None and self.native_ring is None:
                from autoannot.observe import native_ring

                self.native_ring = native_ring.ProxiesRing(module)
                self.state.add_listener(self.native_ring.demand_changed)
            self._proxies_module = module
        return module

    def hooks_native_module(self) -> Any:
        """The native module whose process-group hooks stand in for Python's, where the hooks
        observe and it is built for this torch, with them, and allowed; else None."""
        if not (self.config.native and self.group_hooks_observe()):
            return None
        from autoannot import native

        try:
            module = native.load()
        except Exception as exc:  # Python's hooks instead
            from autoannot.base import diagnostics

            diagnostics.warn_once("native hooks", "loading", exc)
            return None
        return module if getattr(module, "GROUP_HOOKS", False) else None

    def python_layer(self) -> Any:
        """The Python layer (dispatcher kernels on a borrowed key), where no native observer
        sees launches below the Python API, nor the process-group hooks; made at the first need,
        None where it cannot be."""
        if self.observer is not None or self.group_hooks_observe():
            return None
        with self._lock:
            if self._layer is _UNSET:
                import sys

                if "torch" not in sys.modules:  # (torch is not loaded yet: nothing to hold)
                    return None
                from autoannot.observe import python_layer

                self._layer = python_layer.create(self)
            return self._layer

    # instrument / uninstrument -------------------------------------------------------------

    def enable(self) -> None:
        """Wrap every collective now, or as soon as torch.distributed is imported. Idempotent."""
        with self._lock:
            if self.state.live:
                return
            self.config = config.from_environment()
            self.state.set_live(True)
            importhook.when_imported("autoannot.agent.proxies",
                                     lambda module: module.install_partial_reducer(
                                         self.proxies.get))
            for name in _HOOKED:
                importhook.when_imported(name, self._on_import)

    def disable(self) -> None:
        """Restore every original object. A proxy someone else wrapped over stays in their
        chain, as a pass-through. Idempotent."""
        with self._lock:
            if not self.state.live:
                return
            self.state.set_live(False)
            for patch in reversed(self.patches):
                _guarded(patch.undo, "restoring", patch)
            self.patches.clear()
            if self._windows is not None:
                _guarded(self._windows.close_all, "closing", "the profilers' windows")
            _guarded(lambda: patching.unbind_proxies_everywhere(self.proxies),
                     "restoring module bindings", "disable")
            layer = self.layer
            if layer is not None:
                _guarded(layer.retire, "removing", "dispatcher kernels")
            import sys

            if "autoannot.agent.proxies" in sys.modules:
                from autoannot.agent import proxies

                _guarded(proxies.remove_partial_reducer, "removing", "functools.partial pickling")

    def installed(self) -> list[patching.Patch]:
        """The patches in place now (for tests and ``autoannot doctor``)."""
        with self._lock:
            return list(self.patches)

    def _on_import(self, module: ModuleType) -> None:
        with self._lock:
            if not self.state.live:
                return
            try:
                self.patches.extend(_HOOKED[module.__name__](self, module))
            except Exception as exc:  # never break the import of torch
                from autoannot.base import diagnostics

                diagnostics.warn_once(module.__name__, "instrumenting", exc)

    def _on_torch(self, torch: ModuleType) -> list[patching.Patch]:
        """Once torch has finished importing: the launch observers."""
        if self.observer is None and self.native_module() is not None:
            from autoannot.observe import native_observer

            self.observer = native_observer.create(self)
            if self.observer is not None:
                from autoannot.observe.wrappers import Exclusion

                self.state.set_exclusion(Exclusion(call=self.observer.module.call_claimed))
                self.state.add_listener(self.observer.demand_changed)
        if getattr(getattr(torch, "version", None), "cuda", None) is not None:
            from autoannot.base import features  # (a CUDA build: found now, not at a first capture)

            features.graph_annotations()
        layer = self.python_layer()
        if layer is not None:
            layer.retired = False  # on again: its kernels stay
            if self.state.journals:  # a journal from the start: the thread importing torch
                layer.hold_for_good()  # and every thread started after hold it, until
                layer.hold_new_threads()  # disable()
        return patching.install_op_namespace(torch.ops.symm_mem, self)


def _install_collectives(agent: Instrumentation, module: ModuleType) -> list[patching.Patch]:
    patches = patching.install_module(module, agent)
    if module.__name__ == "torch.distributed.distributed_c10d":
        patches += _install_group_hooks(agent, module)
    return patches


def _install_group_hooks(agent: Instrumentation, module: ModuleType) -> list[patching.Patch]:
    """Where torch's process groups take collective hooks: they observe the launches no proxy
    sees, on every group: those there are now, and each one made from now on, as it is made
    (``_new_process_group_helper``)."""
    from autoannot.observe import group_hooks

    if not agent.group_hooks_observe():
        return []
    patches = patching.wrap_attribute(module, "_new_process_group_helper",
                                        group_hooks.group_creation_wrapper(agent), agent.proxies)
    if agent.hooks is None:
        agent.hooks = group_hooks.HookObserver(agent, agent.hooks_native_module())
        agent.state.add_listener(agent.hooks.demand_changed)
    agent.hooks.hook_groups(group_hooks.existing_groups())
    return patches


def _install_graphs(agent: Instrumentation, module: ModuleType) -> list[patching.Patch]:
    from autoannot.agent import graph_patches

    return graph_patches.install(module, agent)


def _install_export(agent: Instrumentation, module: ModuleType) -> list[patching.Patch]:
    """Ledger and rows files beside each exported trace; the launches of each profiler's
    window held for its rows."""
    from autoannot.keep import window
    from autoannot.live import export

    profiler = getattr(module, "_KinetoProfile", None)
    return [*patching.wrap_attribute(profiler, "export_chrome_trace", export.after_export(agent),
                                     agent.proxies),
            *patching.wrap_attribute(profiler, "start_trace", window.start_wrapper(agent),
                                     agent.proxies),
            *patching.wrap_attribute(profiler, "stop_trace", window.stop_wrapper(agent),
                                     agent.proxies)]


#: Modules whose import instruments something, and what: ``install(agent, module)`` -> the
#: patches it made.
_HOOKED = {
    # the launch observers: once torch has finished importing (torch.distributed may be
    # imported halfway through it)
    "torch": Instrumentation._on_torch,
    "torch.distributed.distributed_c10d": _install_collectives,
    "torch.distributed._functional_collectives": _install_collectives,
    "torch.cuda.graphs": _install_graphs,  # captures, replays, ledgers
    "torch.profiler.profiler": _install_export,  # ledger files next to exported traces
}


def _guarded(step: Any, what: str, subject: Any) -> None:
    """Run one step of ``disable()``; a failure is said once and the other steps still run."""
    try:
        step()
    except Exception as exc:
        from autoannot.base import diagnostics

        diagnostics.warn_once(str(subject), what, exc)


#: The agent of this process.
INSTRUMENTATION = Instrumentation()


def enable() -> None:
    """Wrap every collective now, or as soon as torch.distributed is imported. Idempotent and
    thread-safe."""
    INSTRUMENTATION.enable()


def disable() -> None:
    """Restore every original object, by identity. Idempotent and thread-safe."""
    INSTRUMENTATION.disable()


def is_enabled() -> bool:
    """Whether the agent is on (collectives are patched as soon as their module is imported)."""
    return INSTRUMENTATION.state.live

"""A minimal post-import hook: call a function right after a named module finishes executing.

Light on purpose (no importlib.abc, no wrapt): it is installed at interpreter start-up when
AUTOANNOT is set, where every millisecond counts.
"""

from __future__ import annotations

import sys

from autoannot.base import locks

TYPE_CHECKING = False  # typing is not imported at start-up: it costs milliseconds
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    Hook = Callable[[ModuleType], None]

_hooks: dict[str, list[Hook]] = {}
_lock = locks.renewed(sys.modules[__name__], "_lock", reentrant=True)


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once ``name`` is imported (now, if it already is)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            hooks = _hooks.setdefault(name, [])
            if hook not in hooks:
                hooks.append(hook)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    hook(module)


def _fire(module: ModuleType) -> None:
    with _lock:
        hooks = _hooks.pop(module.__name__, [])
    for hook in hooks:
        hook(module)


class _Loader:
    """Delegates to the real loader, then fires the hooks."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _fire(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder:
    """A meta-path finder that only intercepts the modules that have hooks."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _hooks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                find_spec = getattr(finder, "find_spec", None)
                if finder is self or find_spec is None:
                    continue
                spec = find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(fullname)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader)
        return spec


_FINDER = _Finder()

"""What the installed torch offers, detected by feature (never by version number).

torch's CUDA-graph kernel annotations (``mark_kernels`` + ``cudaGraphNodeGetToolsId``) moved
between releases: private ``torch.cuda._graph_annotations`` in 2.12-2.13; from 2.14 a public
``torch.cuda.graph_annotations`` that re-exports the public functions while the state stays in
the private module (whether annotations are on, the toolsId probe, ``get_stream_for_pg``, the
recorded annotations). ``graph_annotations()`` finds each piece wherever this torch keeps it,
and says where (``autoannot doctor`` prints it).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

#: Where torch ships its CUDA-graph kernel annotations: public from 2.14, private in 2.12-2.13.
PUBLIC_MODULE = "torch.cuda.graph_annotations"
PRIVATE_MODULE = "torch.cuda._graph_annotations"
GRAPH_ANNOTATION_MODULES = (PUBLIC_MODULE, PRIVATE_MODULE)


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except Exception:  # absent, or broken on this build
        return None


class GraphAnnotations:
    """torch's graph-annotation pieces, each looked up (at call time: a patch of torch's module
    is seen) in the module of this torch that has it. (A plain class: a dataclass costs ~2 ms
    to define, at a first capture.)"""

    __slots__ = ("api", "state")

    def __init__(self, api: ModuleType, state: ModuleType) -> None:
        self.api = api  # the module ``mark_kernels`` is taken from (public where it exists)
        self.state = state  # the module whose globals hold the state (private where it exists)

    def __repr__(self) -> str:
        return f"GraphAnnotations(api={self.api.__name__}, state={self.state.__name__})"

    @property
    def where(self) -> str:
        return f"mark_kernels from {self.api.__name__}, state from {self.state.__name__}"

    @property
    def mark_kernels(self) -> Callable[..., Any]:
        return self.api.mark_kernels

    def enabled(self) -> bool:
        """Whether torch's annotations are on now (for this capture). A torch that does not
        say is taken at its word that ``mark_kernels`` no-ops when off."""
        return bool(getattr(self.state, "_annotations_enabled", True))

    def tools_id_unavailable(self) -> bool | None:
        """torch's own probe (``cudaGraphNodeGetToolsId``); None where this torch has none."""
        probe = _first("_is_tools_id_unavailable", (self.state, self.api))
        if probe is not None:
            return bool(probe())
        available = _first("is_available", (self.api, self.state))
        return None if available is None else not available()

    @property
    def get_stream_for_pg(self) -> Callable[[str], int] | None:
        return _first("get_stream_for_pg", (self.state, self.api))

    def recorded(self) -> dict[Any, Any]:
        """torch's recorded annotations (toolsId -> annotations)."""
        get = _first("get_kernel_annotations", (self.api, self.state))
        if get is not None:
            return dict(get())
        return dict(getattr(self.state, "_kernel_annotations", {}))


def _first(name: str, modules: tuple[ModuleType, ...]) -> Any:
    for module in modules:
        value = getattr(module, name, None)
        if value is not None:
            return value
    return None


@functools.cache
def graph_annotations() -> GraphAnnotations | None:
    """torch's graph annotations, or None where this torch has no ``mark_kernels``."""
    public, private = _import(PUBLIC_MODULE), _import(PRIVATE_MODULE)
    api = next((m for m in (public, private) if m is not None
                and callable(getattr(m, "mark_kernels", None))), None)
    if api is None:
        return None
    state = next((m for m in (private, public) if m is not None
                  and hasattr(m, "_annotations_enabled")), api)
    return GraphAnnotations(api, state)


def graph_annotations_module() -> ModuleType | None:
    """The module holding torch's annotation state (for tests that patch it), or None."""
    api = graph_annotations()
    return api.state if api is not None else None


def tools_id_usable() -> bool:
    """Whether torch's toolsId path can record here: a GPU, and torch's probe answers yes (it
    says yes on a machine without one, where cuda-bindings is installed)."""
    api = graph_annotations()
    if api is None:
        return False
    try:
        return _has_gpu() and api.tools_id_unavailable() is False
    except Exception:
        return False


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def mark_kernels(allowed: bool = True):  # type: ignore[no-untyped-def]
    """torch's ``mark_kernels`` context-manager factory, when entering it would record
    something: ``allowed`` (``AUTOANNOT_MARK_KERNELS``), torch has it, its annotations are on
    for this capture, and the driver answers ``cudaGraphNodeGetToolsId``. Else None (entering
    a no-op generator context costs microseconds per collective)."""
    api = graph_annotations() if allowed else None
    if api is None or not api.enabled() or api.tools_id_unavailable() is not False:
        return None
    return api.mark_kernels


def group_hooks_available() -> bool:
    """Whether this torch's process groups take pre/post collective hooks
    (``ProcessGroup.register_pre_hook`` and the rest: torch >= 2.14). Asked of the loaded
    ``torch._C``, never imported here."""
    import sys

    c10d = getattr(sys.modules.get("torch._C"), "_distributed_c10d", None)
    group = getattr(c10d, "ProcessGroup", None)
    return all(hasattr(group, name) for name in ("register_pre_hook", "register_post_hook",
                                                 "unregister_pre_hook", "unregister_post_hook"))

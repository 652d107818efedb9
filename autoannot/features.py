"""What the installed torch offers, detected by feature (never by version number)."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

#: Where torch ships its CUDA-graph kernel annotations: public from 2.14, private in 2.12-2.13.
GRAPH_ANNOTATION_MODULES = ("torch.cuda.graph_annotations", "torch.cuda._graph_annotations")


@functools.cache
def graph_annotations_module() -> ModuleType | None:
    """torch's graph-annotation module if it has ``mark_kernels``, else None."""
    for name in GRAPH_ANNOTATION_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:  # absent, or broken on this build
            continue
        if callable(getattr(module, "mark_kernels", None)):
            return module
    return None


@functools.cache
def _mark_kernels_allowed() -> bool:
    from autoannot import config

    return config.from_environment().mark_kernels


def mark_kernels():  # type: ignore[no-untyped-def]
    """torch's ``mark_kernels`` context-manager factory, when entering it would record
    something: torch has it, its annotations are on for this capture, the driver answers
    ``cudaGraphNodeGetToolsId``, and ``AUTOANNOT_MARK_KERNELS`` is not 0. Else None (entering
    a no-op generator context costs microseconds per collective)."""
    if not _mark_kernels_allowed():
        return None
    module = graph_annotations_module()
    if module is None or not getattr(module, "_annotations_enabled", True):
        return None
    unavailable = getattr(module, "_is_tools_id_unavailable", None)
    if unavailable is not None and unavailable():
        return None
    return module.mark_kernels

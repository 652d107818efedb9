"""Know, with no CUDA call on the hot path, when a CUDA-graph capture is in progress.

``torch.cuda.CUDAGraph.capture_begin`` / ``capture_end`` (what ``torch.cuda.graph`` and CUDA graph
trees call) are wrapped to keep a count; the collective wrappers only read it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import wrapt

from autoannot.state import STATE


def _capture_begin(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    STATE.capture_started()
    return result


def _capture_end(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    try:
        return wrapped(*args, **kwargs)
    finally:
        STATE.capture_ended()


_WRAPPERS = {"capture_begin": _capture_begin, "capture_end": _capture_end}
_proxies: dict[str, tuple[Any, Any]] = {}


def install(graphs: ModuleType) -> list[Any]:
    """Wrap the capture methods of ``graphs.CUDAGraph``; returns the patches made."""
    from autoannot.patching import Patch

    graph_class = getattr(graphs, "CUDAGraph", None)
    patches = []
    for name, wrapper in _WRAPPERS.items():
        original = graph_class.__dict__.get(name) if graph_class is not None else None
        if original is None:
            continue
        cached = _proxies.get(name)
        if cached is not None and cached[1] is original:
            continue  # already ours
        proxy = cached[1] if cached is not None and cached[0] is original else (
            wrapt.FunctionWrapper(original, wrapper)
        )
        _proxies[name] = (original, proxy)
        setattr(graph_class, name, proxy)
        patches.append(Patch(graph_class, name, original, proxy))
    return patches

"""autoannot: annotate every torch.distributed collective with the metadata eager NCCL kernels
carry in the profiler, so that CUDA-graphed collectives read like eager ones.

    import autoannot
    autoannot.enable()            # or run with AUTOANNOT=1
    with autoannot.record() as records:
        dist.all_reduce(t)
    records[0].annotation         # {"Collective name": "allreduce", "In msg nelems": ..., ...}

Importing this package imports neither torch nor wrapt: the rest loads on first use.

(PYTEST_DONT_REWRITE: under AUTOANNOT=1 the start-up hook imports this package before pytest
can rewrite it, as a pytest11 plugin's package; it holds no assertion to rewrite.)
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at start-up: it costs milliseconds
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "enable": "autoannot.agent.instrumentation",
    "disable": "autoannot.agent.instrumentation",
    "is_enabled": "autoannot.agent.instrumentation",
    "record": "autoannot.recorder",
    "Record": "autoannot.keep.records",
    "Recording": "autoannot.keep.records",
    "annotate_collective": "autoannot.helper",
    "AnnotationContext": "autoannot.observe.annotation",
    "describe_call": "autoannot.helper",
    "AutoannotWarning": "autoannot.base.diagnostics",
    "SequenceMismatch": "autoannot.live.verify",
}

__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autoannot' has no attribute {name!r}")
    import importlib  # here, not at the top: the start-up hook imports this package

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

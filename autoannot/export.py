"""Ledger files next to exported traces, and (optionally) annotating traces as they are exported.

For a trace exported to ``DIR/NAME.json`` (or ``.json.gz``) each rank writes
``DIR/NAME.autoannot.json``: the ledger of every CUDA graph the process captured with the agent
on (graph name -> collectives in capture order) and, where torch's toolsId path ran, torch's
kernel annotations (toolsId -> annotations). ``autoannot annotate`` finds it by that name.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from types import ModuleType
from typing import Any

FORMAT = "autoannot-ledger"
VERSION = 1
SUFFIX = ".autoannot.json"


def ledger_path(trace_path: str | os.PathLike[str]) -> str:
    """``run/trace.json(.gz)`` -> ``run/trace.autoannot.json``."""
    path = os.fspath(trace_path)
    for ending in (".gz", ".json"):
        path = path.removesuffix(ending)
    return path + SUFFIX


def atomic_write_text(path: str, text: str) -> None:
    """Write to a temporary file in the same folder, then rename: never a half-written file."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".autoannot-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # what open() would have given, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def ledger_document() -> dict[str, Any] | None:
    """This process's ledgers and torch's toolsId annotations; None when there are none."""
    from autoannot import capture, features

    graphs = {name: ledger.entries for name, ledger in capture.LEDGERS.items()}
    tools_id: dict[str, Any] = {}
    module = features.graph_annotations_module()
    get = getattr(module, "get_kernel_annotations", None)
    if get is not None:
        tools_id = {str(k): v for k, v in get().items()}
    if not graphs and not tools_id:
        return None
    dist = sys.modules.get("torch.distributed")
    rank = dist.get_rank() if dist is not None and dist.is_initialized() else None
    return {"format": FORMAT, "version": VERSION, "rank": rank, "pid": os.getpid(),
            "graphs": graphs, "tools_id": tools_id}


def write_ledger(trace_path: str) -> str | None:
    document = ledger_document()
    if document is None:
        return None
    path = ledger_path(trace_path)
    atomic_write_text(path, json.dumps(document, default=str))
    return path


def _after_export(wrapped: Any, profiler: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    path = args[0] if args else kwargs.get("path")
    try:
        from autoannot.state import STATE

        if path is not None and STATE.live and write_ledger(path) is not None:
            from autoannot import config

            if config.from_environment().annotate_on_export:
                from autoannot import tracetool

                tracetool.annotate_file(path, path)
    except Exception as exc:  # the trace is exported; our part failed
        from autoannot import diagnostics

        diagnostics.warn_once("export_chrome_trace", "writing the autoannot ledger", exc)
    return result


def install(module: ModuleType) -> list[Any]:
    """Wrap ``_KinetoProfile.export_chrome_trace`` (what ``profile.export_chrome_trace`` and
    ``tensorboard_trace_handler`` call)."""
    from autoannot import capture

    owner = getattr(module, "_KinetoProfile", None)
    return capture.wrap_attribute(owner, "export_chrome_trace", _after_export)

"""Ledger files next to exported traces, and (optionally) annotating traces as they are exported.

For a trace exported to ``DIR/NAME.json`` (or ``.json.gz``) each rank writes the ledger of
this process (``DIR/NAME.autoannot``: see ``traces.ledger``); ``autoannot annotate`` finds it
by that name. With ``AUTOANNOT_ANNOTATE_ON_EXPORT=1`` each rank also annotates the trace it
exported, in place (``AUTOANNOT_LANES=1``: with its collectives on their groups' lanes).
"""

from __future__ import annotations

import contextlib
import os
import sys
from types import ModuleType
from typing import Any


def ledger_document(agent: Any) -> dict[str, Any] | None:
    """This process's ledgers and torch's toolsId annotations; None when there are none."""
    from autoannot import features

    graphs = {name: ledger.entries for name, ledger in agent.captures.ledgers.all().items()}
    api = features.graph_annotations()
    tools_id = {str(k): v for k, v in api.recorded().items()} if api is not None else {}
    if not graphs and not tools_id:
        return None
    dist = sys.modules.get("torch.distributed")
    rank = dist.get_rank() if dist is not None and dist.is_initialized() else None
    return {"rank": rank, "pid": os.getpid(), "graphs": graphs, "tools_id": tools_id}


def write_ledger(trace_path: str, agent: Any) -> str | None:
    document = ledger_document(agent)
    if document is None:
        return None
    from autoannot.traces import ledger as ledgers  # at the first export, not at start-up

    return ledgers.write(trace_path, document)


def _after_export(agent: Any) -> Any:
    """``export_chrome_trace``'s wrapper: the ledger file, then (if asked) the annotation."""

    def after_export(wrapped: Any, profiler: Any, args: tuple, kwargs: dict) -> Any:
        result = wrapped(*args, **kwargs)
        path = args[0] if args else kwargs.get("path")
        try:
            if path is not None and agent.state.live and write_ledger(path, agent) is not None:
                settings = agent.config
                if settings.annotate_on_export:
                    from autoannot.traces import annotate

                    with contextlib.suppress(annotate.NothingToAnnotate):  # no replay traced
                        annotate.annotate_file(path, path, lanes=settings.lanes)
        except Exception as exc:  # the trace is exported; our part failed
            from autoannot import diagnostics

            diagnostics.warn_once("export_chrome_trace", "writing the autoannot ledger", exc)
        return result

    return after_export


def install(module: ModuleType, agent: Any) -> list[Any]:
    """Wrap ``_KinetoProfile.export_chrome_trace`` (what ``profile.export_chrome_trace`` and
    ``tensorboard_trace_handler`` call)."""
    from autoannot import cudagraphs

    owner = getattr(module, "_KinetoProfile", None)
    return cudagraphs.wrap_attribute(owner, "export_chrome_trace", _after_export(agent),
                                     agent.proxies)

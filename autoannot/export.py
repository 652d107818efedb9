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


def write_rows(trace_path: str, agent: Any, annotated: bool = False) -> str | None:
    """The rows of the trace this rank just exported (``traces.rows``), beside it, joined
    with this process's record file (its run): call sites, and gloo's groups and sizes. A
    graphed trace with a ledger is read as ``annotate`` would write it (a temporary beside
    it). None where the trace holds no collective."""
    import socket
    import tempfile
    from pathlib import Path

    from autoannot.traces import ledger as ledgers
    from autoannot.traces import rows, skew

    journal = next((j for j in agent.state.journals if j.path is not None), None)
    readable = Path(trace_path)
    scratch = None
    if not annotated and ledgers.find(trace_path) is not None:
        from autoannot.traces import annotate

        scratch = tempfile.TemporaryDirectory(prefix=".autoannot-rows-",
                                              dir=os.path.dirname(os.path.abspath(trace_path)))
        candidate = Path(scratch.name) / readable.name
        try:
            annotate.annotate_file(readable, candidate)
            readable = candidate
        except annotate.NothingToAnnotate:  # (no replay in it: read it as it is)
            pass
    try:
        made = skew.rows_of_trace(readable, None if journal is None else Path(journal.path),
                             run=None if journal is None else journal.run,
                             host=socket.gethostname())
    finally:
        if scratch is not None:
            scratch.cleanup()
    if made is None:
        return None
    made.source = Path(trace_path).name
    if rows.parquet_available():  # the table any tool reads (pandas, polars, DuckDB)
        out = rows.rows_path(trace_path, parquet=True)
        rows.write_parquet(made, out)
    else:  # no pyarrow in this job: the same rows in autoannot's own columns
        out = rows.rows_path(trace_path)
        rows.write(made, out)
    return str(out)


def _after_export(agent: Any) -> Any:
    """``export_chrome_trace``'s wrapper: the ledger file, then (if asked) the annotation."""

    def after_export(wrapped: Any, profiler: Any, args: tuple, kwargs: dict) -> Any:
        result = wrapped(*args, **kwargs)
        path = args[0] if args else kwargs.get("path")
        if path is None or not agent.state.live:
            return result
        settings = agent.config
        annotated = False
        try:
            if write_ledger(path, agent) is not None and settings.annotate_on_export:
                from autoannot.traces import annotate

                with contextlib.suppress(annotate.NothingToAnnotate):  # no replay traced
                    annotate.annotate_file(path, path, lanes=settings.lanes)
                    annotated = True
        except Exception as exc:  # the trace is exported; our part failed
            from autoannot import diagnostics

            diagnostics.warn_once("export_chrome_trace", "writing the autoannot ledger", exc)
        if settings.rows_on_export:
            from autoannot import diagnostics
            from autoannot.traces.files import TraceError

            try:
                write_rows(path, agent, annotated)
            except TraceError as exc:  # the trace's collectives could not be made rows
                diagnostics.say_once(f"rows:{exc}", f"autoannot: no rows written beside {path}: "
                                     f"{exc}")
            except Exception as exc:
                diagnostics.warn_once("export rows", "writing the trace's rows", exc)
        return result

    return after_export


def install(module: ModuleType, agent: Any) -> list[Any]:
    """Wrap ``_KinetoProfile.export_chrome_trace`` (what ``profile.export_chrome_trace`` and
    ``tensorboard_trace_handler`` call)."""
    from autoannot import cudagraphs

    owner = getattr(module, "_KinetoProfile", None)
    return cudagraphs.wrap_attribute(owner, "export_chrome_trace", _after_export(agent),
                                     agent.proxies)

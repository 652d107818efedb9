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
from typing import Any


def ledger_document(agent: Any) -> dict[str, Any] | None:
    """This process's ledgers and torch's toolsId annotations; None when there are none."""
    from autoannot.base import features

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
    from autoannot.traces.read import ledger as ledgers  # at the first export, not at start-up

    return ledgers.write(trace_path, document)


class Exported:
    """The trace this rank just exported, read once into memory: its events' index
    (``annotate.Scan``) and, where it replays graphs this process captured, their annotation
    (``annotate.Patches``, from the ledger). Rows and the in-place annotation both come from
    it: the trace is neither written to a temporary nor read again."""

    def __init__(self, trace_path: str, lanes: bool = False) -> None:
        from pathlib import Path

        from autoannot.traces.files import Trace
        from autoannot.traces.read import annotate
        from autoannot.traces.read import ledger as ledgers

        self.path = Path(trace_path)
        self.trace = Trace(self.path)
        self.scan = annotate.Scan.of(self.trace)
        self.patches: Any = None
        self.report: Any = None
        self.ledger_file: Any = None
        if ledgers.find(trace_path) is not None:
            with contextlib.suppress(annotate.NothingToAnnotate):  # (no replay: as it is)
                self.report, self.patches, self.ledger_file = annotate.prepare(
                    self.trace, self.scan, lanes=lanes)

    def annotate_in_place(self) -> bool:
        """Write the annotation into the trace (atomically); whether there was one."""
        if self.patches is None:
            return False
        from autoannot.traces.read import annotate

        annotate.write(self.trace, self.patches, self.path, self.report, self.ledger_file)
        return True


def write_rows(trace_path: str, agent: Any, exported: Exported | None = None,
               profiler: Any = None) -> str | None:
    """The rows of the trace this rank just exported (``traces.rows``), beside it, joined
    with this process's record file (its run), or else with the launches ``profiler``'s
    window held (``keep.window``: with async launches' completions), or else with its ring's:
    call sites, gloo's groups and sizes. A graphed trace's kernels are read as ``annotate``
    annotates them, in memory (``exported``: the trace as read already). None where the trace
    holds no collective."""
    import socket
    from pathlib import Path

    from autoannot.traces.read import rank_files, ring_files
    from autoannot.traces.table import rows

    journal = next((j for j in agent.state.journals if j.path is not None), None)
    exported = exported or Exported(trace_path)
    run, kept = None if journal is None else journal.run, None
    if journal is None:  # (the window's launches, with their completions, or else the
        window = agent.windows.held(profiler) if profiler is not None else None  # ring's,
        held = (None if window is None else  # name gloo's as a record file's lines do)
                ring_files.read_held(*window, label="the profiler's window"))
        ring = next((j for j in agent.state.journals if getattr(j, "ring_path", None)), None)
        if held is None and ring is not None:
            held = ring_files.read(Path(ring.ring_path))
        if held is not None:
            run, kept = held.meta.get("run"), (held.rank, ring_files.launches_of(held))
    made = rank_files.rows_of_trace(exported.path, None if journal is None else Path(journal.path),
                              run=run, host=socket.gethostname(),
                              scanned=(exported.trace, exported.scan, exported.patches),
                              kept=kept)
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


def after_export(agent: Any) -> Any:
    """The wrapper of ``_KinetoProfile.export_chrome_trace`` (what ``profile.
    export_chrome_trace`` and ``tensorboard_trace_handler`` call): the ledger file; then the
    trace read once, to annotate it in place (if asked) and to write its rows."""

    def after_export(wrapped: Any, profiler: Any, args: tuple, kwargs: dict) -> Any:
        result = wrapped(*args, **kwargs)
        path = args[0] if args else kwargs.get("path")
        if path is None or not agent.state.live:
            return result
        from autoannot.base import diagnostics
        from autoannot.traces.files import TraceError

        settings = agent.config
        exported = None
        try:
            ledger = write_ledger(path, agent)
            if settings.rows_on_export or (ledger is not None and settings.annotate_on_export):
                exported = Exported(path, lanes=settings.lanes)
                if settings.annotate_on_export:
                    exported.annotate_in_place()
        except TraceError as exc:  # the trace is exported; it could not be read or annotated
            diagnostics.say_once(f"export:{exc}", f"autoannot: {path}: no annotation or rows: "
                                 f"{exc}")
            return result
        except Exception as exc:  # the trace is exported; our part failed
            diagnostics.warn_once("export_chrome_trace", "writing the autoannot ledger", exc)
            return result
        if settings.rows_on_export and exported is not None:
            try:
                write_rows(path, agent, exported, profiler)
            except TraceError as exc:  # the trace's collectives could not be made rows
                diagnostics.say_once(f"rows:{exc}", f"autoannot: no rows written beside {path}: "
                                     f"{exc}")
            except Exception as exc:
                diagnostics.warn_once("export rows", "writing the trace's rows", exc)
        return result

    return after_export

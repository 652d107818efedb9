"""What ``skew`` and ``report`` share: their inputs lined up across ranks (rows, traces — a
graphed one annotated first —, record files), on this machine or a Dask cluster."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from autoannot.traces.commands.common import INCOMPLETE, bad_input, check_written, positive, say


def analysis_of(command: str, args: argparse.Namespace,
                outputs: list[Path]) -> tuple[Any, list[Path]]:
    """The analysis of the inputs (``args.inputs``) and the inputs; or the exit status where
    there is none to make (said)."""
    from autoannot.traces import files
    from autoannot.traces.analysis import lineup
    from autoannot.traces.read import inputs as input_files

    try:
        traces, records, rows = input_files.cross_rank(args.inputs, lambda m: say(command, m))
        inputs = [*rows, *traces, *records]
        # never written over, even with --force: any file given, or in a folder given
        check_written([*inputs, *input_files.every_file(args.inputs)], outputs, args.force)
        with tempfile.TemporaryDirectory(prefix=f"autoannot-{command}-") as scratch:
            readable = annotated_in(traces, Path(scratch))
            engine = _engine(args)
            try:
                analysis = lineup.analyze_files(readable, records, jobs=args.jobs,
                                                progress=not args.quiet, run=args.run,
                                                rows=rows, include_warmup=args.include_warmup,
                                                engine=engine, target=args.partition_launches)
            finally:
                if engine is not None:
                    engine.close()
            for said in (analysis.problems, analysis.notes):  # (name the user's files)
                for read, given in zip(readable, traces, strict=True):
                    said[:] = [line.replace(str(read), str(given)) for line in said]
    except FileNotFoundError as exc:
        return bad_input(command, f"{exc.args[0]}: no such file"), []
    except files.TraceError as exc:
        return bad_input(command, str(exc)), []
    if len(analysis.ranks) < 2:
        say(command, f"one rank's inputs ({', '.join(map(str, inputs))}): give every rank's "
            "rows, trace or record file to line its collectives up")
        return INCOMPLETE, inputs
    return analysis, inputs


def annotated_in(traces: list[Path], scratch: Path) -> list[Path]:
    """Each trace as ``skew`` can read it: a raw graphed trace with its ledger beside it is
    annotated into ``scratch`` first (as ``annotate`` would: its graphed kernels get their
    args); every other trace as it is."""
    if not traces:
        return []
    from autoannot.traces import files
    from autoannot.traces.read import annotate, ledger

    readable = []
    for position, trace in enumerate(traces):
        if files.is_annotated_output(trace) or ledger.find(trace) is None:
            readable.append(trace)
            continue
        out = scratch / str(position) / trace.name
        out.parent.mkdir()
        try:
            annotate.annotate_file(trace, out)
        except (annotate.NothingToAnnotate, files.TraceError):
            readable.append(trace)  # (eager, or not this trace's ledger: read it as it is)
        else:
            readable.append(out)
    return readable


def _engine(args: argparse.Namespace) -> Any:
    """The engine asked for: this machine's (``-j``), or Dask's."""
    from autoannot.traces.analysis import engines

    return engines.make(args.engine, getattr(args, "jobs", None), args.scheduler, args.workers,
                        args.worker_memory, progress=not args.quiet)


def engine_arguments(command: argparse.ArgumentParser) -> None:
    """The options of where the analysis runs."""
    engine = command.add_argument_group(
        "engine", "where the analysis runs: this machine (embedded, the default: partitions "
        "of rows read one at a time on its cores, for rows beyond its memory too) or a Dask "
        "cluster (pip install 'autoannot[dask]'; every worker must see the rows files)")
    engine.add_argument("--engine", choices=("embedded", "dask"), default="embedded",
                        help="embedded (default) or dask")
    engine.add_argument("--scheduler", metavar="ADDRESS",
                        help="the Dask scheduler (tcp://host:8786; default: "
                        "$DASK_SCHEDULER_ADDRESS, else a local cluster)")
    engine.add_argument("--workers", type=positive, metavar="N",
                        help="worker processes of the local Dask cluster (default 4)")
    engine.add_argument("--worker-memory", metavar="SIZE",
                        help="each local Dask worker's memory limit (2GB, ...; default: "
                        "this machine's memory shared out)")
    engine.add_argument("--partition-launches", type=positive, metavar="N",
                        help="launches a partition holds, about (default: a job of up to "
                        "24,000,000 run here is one, read once; else 4,000,000: ~600 MB a "
                        "partition task)")

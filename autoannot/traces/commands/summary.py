"""``autoannot summary TRACE|DIR|RECORDS... [-o FILE]``: per process group, collective, dtype and
size, what moved and how fast (traces), how often (record files), lined up (rows)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from autoannot.traces.commands.common import (
    DONE,
    INCOMPLETE,
    bad_input,
    check_written,
    not_json_or_csv,
    say,
    write_outputs,
)


def run(args: argparse.Namespace) -> int:
    from autoannot.traces import files

    outputs = [Path(o) for o in args.output or []]
    wrong = not_json_or_csv(outputs)
    if wrong:
        return bad_input("summary", wrong)
    try:
        result = summarize(args, outputs)
    except FileNotFoundError as exc:
        return bad_input("summary", f"{exc.args[0]}: no such file")
    except files.TraceError as exc:
        return bad_input("summary", str(exc))
    for note in result.notes:
        say("summary", note)
    rows = result.rows + result.cpu_rows + result.record_rows + result.instance_rows
    failed = write_outputs("summary", {out: _writer(out, result, rows) for out in outputs})
    if failed is not None:
        return failed
    if args.json:  # (after the files: a reader that leaves early loses none of them)
        print(json.dumps({"rows": result.rows, "cpu_rows": result.cpu_rows,
                          "record_rows": result.record_rows,
                          "instance_rows": result.instance_rows, "notes": result.notes},
                         indent=1))
    else:
        _print_tables(result)
    return DONE if rows else INCOMPLETE


def summarize(args: argparse.Namespace, outputs: list[Path]) -> Any:
    """The summary of the inputs (``render.summary.Summary``): traces' kernels, else record
    files' counts and rows lined up (TraceError, FileNotFoundError as it can)."""
    from autoannot.traces import files, paths
    from autoannot.traces.read import inputs as input_files
    from autoannot.traces.read import record_files, runs
    from autoannot.traces.render import summary

    rows_files: list[Path] = []
    named, records = input_files.split(args.traces, rows_files, lambda m: say("summary", m))
    skipped: list[str] = []
    traces = paths.expand(named, skip_outputs=False, skipped=skipped) if named else []
    check_written([*traces, *records, *rows_files], outputs, args.force)
    run = runs.choose(record_files.runs_in(records, rows_files), args.run)  # (one rule)
    for note in skipped:
        say("summary", note)
    if traces and rows_files:  # (rows are what the job made of its traces: fewer facts)
        say("summary", f"{len(rows_files)} rows files beside the traces: summarized from the "
            "traces")
        rows_files = []
    result = (summary.summarize(traces, progress=not args.quiet, jobs=args.jobs) if traces
              else summary.Summary([], [], []))
    if records:
        result.record_rows = summary.record_rows(records, run)
        result.notes = [n for n in result.notes if "AUTOANNOT_RECORD" not in n]
    if rows_files:
        try:
            from autoannot.traces.analysis import lineup
            from autoannot.traces.render import report

            result.instance_rows = report.group_rows(
                lineup.analyze_files([], [], run=run, rows=rows_files))
        except ImportError:
            raise files.TraceError("rows files need numpy: pip install numpy") from None
    return result


def _writer(out: Path, result: Any, rows: list[dict[str, Any]]) -> Any:
    """What writes the ``-o`` file ``out``: the first kind of rows as CSV, or all as JSON."""
    from autoannot.traces import files
    from autoannot.traces.render import summary

    if out.suffix == ".csv":
        return lambda tmp: summary.write_csv(result.rows or result.cpu_rows
                                             or result.record_rows or result.instance_rows, tmp)
    return lambda tmp: files.atomic_write_text(tmp, json.dumps(rows, indent=1))


def _print_tables(result: Any) -> None:
    from autoannot.traces.render import summary

    for rows, table in ((result.rows, summary.format_table),
                        (result.cpu_rows, summary.format_cpu_table),
                        (result.record_rows, summary.format_record_table),
                        (result.instance_rows, summary.format_instance_table)):
        if rows:
            print(table(rows))

"""``autoannot annotate TRACE|DIR... [-o OUT]``: give graphed NCCL kernels their eager args."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from autoannot.traces.commands.common import (
    BAD_INPUT,
    DONE,
    INCOMPLETE,
    bad_input,
    check_written,
    say,
)


def plan(args: argparse.Namespace) -> tuple[list[Path], list[Path]]:
    """The traces to read and the outputs to write; TraceError for a plan that cannot be."""
    from autoannot.traces import files, paths

    skipped: list[str] = []
    traces = paths.expand(args.traces, skipped=skipped)
    for note in skipped:
        say("annotate", note)
    for trace in traces:
        marker = files.annotated_from(trace)
        if marker is not None:
            raise files.TraceError(
                f"{trace}: written by autoannot annotate already (annotated from "
                f"{marker.get('from', '?')}): give the raw trace")
    if args.ledger:
        if len(traces) != 1:
            raise files.TraceError("--ledger takes one trace")
        if not Path(args.ledger).is_file():
            raise files.TraceError(f"{args.ledger}: no such ledger file")
    outputs = paths.plan_outputs(traces, args.output, args.format)
    check_written([*traces, *([Path(args.ledger)] if args.ledger else [])], outputs,
                  args.force)
    return traces, outputs


def _outcome(result: dict[str, Any]) -> str:
    if "error" in result:
        return "failed:"
    if "nothing" in result:
        return "nothing to annotate in"
    return "annotated" if _complete(result["report"]) else "partly annotated"


def _complete(report: dict[str, Any]) -> bool:
    return (report["kernels_annotated"] > 0 and not report["kernels_left"]
            and not report["mismatches"])


def run(args: argparse.Namespace) -> int:
    from autoannot.traces import files, parallel
    from autoannot.traces import outputs as written
    from autoannot.traces.read import annotate

    try:
        traces, outputs = plan(args)
    except files.TraceError as exc:
        return bad_input("annotate", str(exc))
    ledger = Path(args.ledger) if args.ledger else None
    jobs = [(trace, out, ledger, args.lanes, args.force)
            for trace, out in zip(traces, outputs, strict=True)]
    results = list(parallel.map_files(annotate.annotate_job, jobs, args.jobs,
                                      show=not args.quiet, name=lambda job: job[0],
                                      outcome=_outcome))
    written.remember([job[1] for job, result in zip(jobs, results, strict=True)  # (a JSON
                      if "report" in result and job[1].suffix == ".pftrace"],  # trace carries
                     "annotate")  # its marker)
    reports, status = [], DONE
    for (trace, out, *_), result in zip(jobs, results, strict=True):
        reports.append(_said(trace, out, result, args.json))
        status = max(status, BAD_INPUT if "error" in result else INCOMPLETE
                     if "nothing" in result or not _complete(result["report"]) else DONE)
    if args.json:
        print(json.dumps(reports, indent=1))
    return status


def _said(trace: Path, out: Path, result: dict[str, Any], as_json: bool) -> dict[str, Any]:
    """What is said of one trace's annotation (its problems on stderr; its line unless JSON
    is asked for), and its entry in the JSON report."""
    if "error" in result:
        say("annotate", result["error"])
        return {"trace": str(trace), "error": result["error"]}
    if "nothing" in result:
        say("annotate", result["nothing"])
        return {"trace": str(trace), "nothing": result["nothing"]}
    report = result["report"]
    for problem in report["mismatches"]:
        print(f"{trace}: mismatch: {problem}", file=sys.stderr)
    for note in report["notes"]:
        print(f"{trace}: {note}", file=sys.stderr)
    if not as_json:
        left = (f", {report['kernels_left']} of the trace's "
                f"{report['graphed_nccl_kernels']} graphed NCCL kernels left unannotated"
                if report["kernels_left"] else "")
        print(f"{trace} -> {out}: {report['kernels_annotated']}/"
              f"{report['kernels_expected']} graphed NCCL kernels annotated in "
              f"{report['launches_of_known_graphs']} replays ({report['order_resolved']} "
              f"by capture order, {len(report['mismatches'])} mismatches{left})")
    return {**report, "output": str(out)}

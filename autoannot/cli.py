"""The ``autoannot`` command line.

    autoannot annotate TRACE... [-o OUT]   merge the annotations into Kineto traces
    autoannot summary TRACE...             per process group: what moved, how fast
    autoannot plot TRACE... -o PNG         a timeline picture, one band per rank
    autoannot doctor [--json]              what this machine has, which path the agent takes
    autoannot run CMD [ARGS...]            run CMD with every Python process in it instrumented
    autoannot hook-path                    the directory of the sitecustomize hook

Exit codes: 0 done; 1 done, but some kernels could not be matched (reported); 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import autoannot

HOOK_DIR = Path(__file__).parent / "_hook"


def _jobs(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value}: give 1 or more")
    return number


def _bad_input(command: str, message: str) -> int:
    """Say what is wrong in one line on stderr; return the exit code for bad input (2)."""
    print(f"autoannot {command}: {message}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
    if not args.command:
        return _bad_input("run", "give a command to run")
    env = dict(os.environ, AUTOANNOT="1")
    if args.record:
        env["AUTOANNOT_RECORD"] = args.record
    paths = [str(HOOK_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    try:
        os.execvpe(args.command[0], args.command, env)
    except OSError as exc:
        print(f"autoannot run: cannot run {args.command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


def _outputs(traces: list[Path], output: str | None) -> list[Path]:
    from autoannot.traces import annotate

    if output is None:
        return [annotate.default_output(t) for t in traces]
    out = Path(output)
    if len(traces) > 1 or out.is_dir() or output.endswith(("/", os.sep)):
        out.mkdir(parents=True, exist_ok=True)
        return [out / t.name for t in traces]
    return [out]


def _annotate(args: argparse.Namespace) -> int:
    from autoannot.traces import annotate

    traces = [Path(t) for t in args.traces]
    if args.ledger and len(traces) != 1:
        return _bad_input("annotate", "--ledger takes one trace")
    try:
        outputs = _outputs(traces, args.output)
    except OSError as exc:
        return _bad_input("annotate", f"{args.output}: cannot create: {exc.strerror}")
    for out in outputs:
        if not out.name.endswith((".json", ".json.gz", ".pftrace")):
            return _bad_input("annotate", f"{out}: unknown output format (use .json, "
                              ".json.gz or .pftrace)")
    from autoannot.traces import parallel

    ledger = Path(args.ledger) if args.ledger else None
    jobs = [(trace, out, ledger, args.lanes) for trace, out in zip(traces, outputs, strict=True)]
    reports, status = [], 0
    results = parallel.map_files(annotate.annotate_job, jobs, args.jobs, "annotated",
                                 name=lambda job: job[0])
    for (trace, out, _, _), result in zip(jobs, results, strict=True):
        if "error" in result:
            return _bad_input("annotate", result["error"])
        report = result["report"]
        reports.append({**report, "output": str(out)})
        for problem in report["mismatches"]:
            print(f"{trace}: mismatch: {problem}", file=sys.stderr)
        if report["mismatches"]:
            status = 1
        if not args.json:
            print(f"{trace} -> {out}: {report['kernels_annotated']}/"
                  f"{report['kernels_expected']} graphed NCCL kernels annotated in "
                  f"{report['launches_of_known_graphs']} replays ({report['order_resolved']} "
                  f"by capture order, {len(report['mismatches'])} mismatches)")
    if args.json:
        print(json.dumps(reports, indent=1))
    return status


def _summary(args: argparse.Namespace) -> int:
    from autoannot.traces import files, summary

    try:
        rows = summary.summarize([Path(t) for t in args.traces], progress=not args.quiet,
                                 jobs=args.jobs)
    except files.TraceError as exc:
        return _bad_input("summary", str(exc))
    if not rows:
        print("autoannot summary: no NCCL kernel carries collective args in these traces "
              "(annotate graphed traces first: autoannot annotate)", file=sys.stderr)
        return 1
    print(summary.format_table(rows))
    try:
        if args.csv:
            summary.write_csv(rows, Path(args.csv))
        if args.json:
            files.atomic_write_text(args.json, json.dumps(rows, indent=1))
    except OSError as exc:
        return _bad_input("summary", f"cannot write: {exc}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from autoannot.traces import files

    output = Path(args.output)
    if output.suffix not in (".png", ".svg", ".pdf"):
        return _bad_input("plot", f"{output}: use .png, .svg or .pdf")
    from autoannot.traces import plot  # matplotlib itself is imported when drawing

    try:
        drawn = plot.plot([Path(t) for t in args.traces], output, args.title)
    except ImportError:
        return _bad_input("plot", "needs matplotlib: pip install matplotlib")
    except files.TraceError as exc:
        return _bad_input("plot", str(exc))
    except OSError as exc:
        return _bad_input("plot", f"{output}: cannot write: {exc.strerror}")
    print(f"{output}: {drawn['ranks']} ranks, {drawn['lanes']} lanes, {drawn['kernels']} "
          "kernels")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from autoannot import doctor

    report = doctor.diagnose()
    print(json.dumps(report, indent=1) if args.json else doctor.format_report(report))
    return 0


def _hook_path(args: argparse.Namespace) -> int:
    print(HOOK_DIR)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoannot",
        description="Annotate torch.distributed collectives so CUDA-graphed NCCL kernels "
        "carry their eager profiler metadata.",
    )
    parser.add_argument("--version", action="version", version=autoannot.__version__)
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    annotate = sub.add_parser(
        "annotate", help="merge the agent's annotations into Kineto traces",
        description="Give every graphed NCCL kernel the args of its eager kernel, from the "
        "ledger each rank wrote next to its trace (NAME.autoannot), leaving it where it ran. "
        "Exit 0: done; 1: some kernels could not be matched (reported); 2: bad input.")
    annotate.add_argument("traces", nargs="+", metavar="TRACE",
                          help="Kineto traces (.json or .json.gz), one per rank")
    annotate.add_argument("-o", "--output", metavar="OUT", help="output file (one trace) or "
                          "directory; .json, .json.gz or .pftrace (Perfetto). Default: "
                          "NAME.annotated.json next to each trace")
    annotate.add_argument("--ledger", metavar="LEDGER",
                          help="the ledger file, when it is not next to the (single) trace")
    annotate.add_argument("--json", action="store_true", help="print the reports as JSON")
    annotate.add_argument("--lanes", action="store_true",
                          help="move each annotated kernel to its process group's lane (one row "
                               "per group in a viewer; stream-based analyses then change)")
    annotate.add_argument("-j", "--jobs", type=_jobs, metavar="N",
                          help="traces annotated at once (default: the cores)")
    annotate.set_defaults(func=_annotate)
    summ = sub.add_parser(
        "summary", help="per process group, collective, dtype and size: counts, time, bandwidth",
        description="Summarize the NCCL kernels that carry collective args (eager traces, and "
        "graphed traces after `autoannot annotate`), one trace per rank: count, bytes, total "
        "and median time, algbw and busbw (nccl-tests factors), across ranks.")
    summ.add_argument("traces", nargs="+", metavar="TRACE")
    summ.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    summ.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    summ.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    summ.add_argument("-j", "--jobs", type=_jobs, metavar="N",
                      help="traces read at once (default: the cores)")
    summ.set_defaults(func=_summary)
    plot = sub.add_parser("plot", help="a timeline picture: one band per rank, a lane per group",
                          description="Draw compute and each process group's collectives, "
                          "one band per rank (needs matplotlib).")
    plot.add_argument("traces", nargs="+", metavar="TRACE")
    plot.add_argument("-o", "--output", required=True, metavar="PNG",
                      help="the picture (.png, .svg or .pdf)")
    plot.add_argument("--title", help="the picture's title")
    plot.set_defaults(func=_plot)
    doc = sub.add_parser("doctor", help="versions, the annotation path, what is missing",
                         description="What this machine has, which annotation path the agent "
                         "will take, what is missing for torch's toolsId path and how to get "
                         "it, and whether the AUTOANNOT start-up hook would fire.")
    doc.add_argument("--json", action="store_true", help="the report as JSON")
    doc.set_defaults(func=_doctor)
    run = sub.add_parser("run", help="run a command with the agent on in every Python process",
                         description="Run CMD with AUTOANNOT=1 and the start-up hook on "
                         "PYTHONPATH, so every Python process it starts is instrumented.")
    run.add_argument("--record", metavar="PATH", help="append each annotation as a JSON line "
                     "to PATH ({rank} and {pid} are filled in)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments")
    run.set_defaults(func=_run)
    hook = sub.add_parser("hook-path", help="print the directory of the sitecustomize hook")
    hook.set_defaults(func=_hook_path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:  # `autoannot ... | head`: the reader left; leave quietly too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

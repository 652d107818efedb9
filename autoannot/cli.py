"""The ``autoannot`` command line: parsing and dispatch, nothing decided here. Each command is a
function of its parsed arguments to an exit status, in the part that owns it: the trace tools'
(``traces.commands``: annotate, summary, skew, report, check, plot), the live wing's
(``live.watch_command``: watch) and the agent's (``agent.commands``: run, build-native, doctor,
hook-path).

The same option means the same thing in every command: ``-o`` names what is written (never an
input), ``--json`` prints JSON on stdout instead of text, ``-j`` the processes, ``-q`` no
progress. A folder stands for the traces in it.

Exit codes: 0 done; 1 done, but something was left undone or there was nothing to do
(reported); 2 bad input (nothing of that input written); 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

import autoannot
from autoannot.agent import commands
from autoannot.agent.commands import HOOK_DIR
from autoannot.live import watch_command
from autoannot.traces.commands import annotate, check, plot, report, skew, summary
from autoannot.traces.commands.common import (
    BAD_INPUT,
    CREATED,
    FORCE_HELP,
    INTERRUPTED,
    remove_created,
)
from autoannot.traces.commands.common import positive as _jobs
from autoannot.traces.commands.lined_up import engine_arguments

__all__ = ["HOOK_DIR", "build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoannot",
        description="Annotate torch.distributed collectives so CUDA-graphed NCCL kernels "
        "carry their eager profiler metadata.",
        epilog="Exit codes: 0 done; 1 done, but something left undone or nothing to do; "
        "2 bad input.")
    parser.add_argument("--version", action="version", version=autoannot.__version__)
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    traces_help = "Kineto traces (.json, .json.gz), one per rank, or folders of them"

    def common(command: argparse.ArgumentParser, jobs: str | None) -> None:
        command.add_argument("--json", action="store_true",
                             help="print JSON on stdout instead of text")
        command.add_argument("-q", "--quiet", action="store_true", help="no progress display")
        if jobs:
            command.add_argument("-j", "--jobs", type=_jobs, metavar="N",
                                 help=f"{jobs} at once (default: the cores)")

    annotate_ = sub.add_parser(
        "annotate", help="give graphed NCCL kernels the args of their eager kernels",
        description="Give every graphed NCCL kernel the args of its eager kernel, from the "
        "ledger each rank wrote next to its trace (NAME.autoannot), leaving it where it ran. "
        "Exit 0: every graphed NCCL kernel annotated; 1: some left (reported) or nothing to "
        "annotate; 2: bad input.")
    annotate_.add_argument("traces", nargs="+", metavar="TRACE", help=traces_help)
    annotate_.add_argument("-o", "--output", metavar="OUT",
                          help="output file (one trace) or folder (any number: their layout "
                          "is kept); default: annotated/NAME next to each trace")
    annotate_.add_argument("--format", choices=("json", "json.gz", "pftrace"),
                          help="output format (default: the -o name's, else the trace's); "
                          "pftrace: Perfetto")
    annotate_.add_argument("--ledger", metavar="LEDGER",
                          help="the ledger file, when it is not next to the (single) trace")
    annotate_.add_argument("--force", action="store_true",
                          help="use a ledger that does not belong to the trace (another rank "
                          "or process, other graphs), and write over outputs autoannot did not "
                          "write")
    annotate_.add_argument("--lanes", action="store_true",
                          help="move each annotated kernel to its process group's lane (one row "
                               "per group in a viewer; stream-based analyses then change)")
    common(annotate_, "traces annotated")
    annotate_.set_defaults(func=annotate.run)
    summ = sub.add_parser(
        "summary", help="per process group, collective, dtype and size: counts, time, bandwidth",
        description="Summarize the collectives of one trace per rank: NCCL kernels that carry "
        "collective args (eager traces, and graphed traces after `autoannot annotate`): count, "
        "bytes, total and median time, algbw and busbw (nccl-tests factors); gloo collectives "
        "(CPU traces): counts and time.")
    summ.add_argument("traces", nargs="+", metavar="TRACE_OR_RECORDS",
                      help=f"{traces_help}; AUTOANNOT_RECORD files (*.jsonl)")
    summ.add_argument("-o", "--output", metavar="FILE", action="append",
                      help="also write the rows to FILE (.json or .csv; may be repeated)")
    summ.add_argument("--force", action="store_true", help=FORCE_HELP)
    summ.add_argument("--run", metavar="RUN", help="the run of the job, where record files "
                      "hold several (they name each)")
    common(summ, "traces read")
    summ.set_defaults(func=summary.run)
    skew_ = sub.add_parser(
        "skew", help="per collective across ranks: who arrived last, who waited, the transfer",
        description="Line up each collective across its ranks (same process group, same place "
        "in its sequence) from the rows each rank wrote at export (*.rows.parquet, *.rows), one "
        "trace per rank (eager NCCL, or graphed after `autoannot annotate`) and/or the ranks' "
        "AUTOANNOT_RECORD files (*.jsonl: call sites; gloo groups and sizes): missing ranks "
        "first; per instance the last rank to arrive, the skew, each rank's wait (never more "
        "than its own time in it) and the transfer; where each delay began, blamed once; per "
        "rank the time it waited and the others' wait blamed on it. Clock offsets between "
        "ranks are fitted on the instances' end times and reported. Exit 1 where ranks are "
        "missing or collectives could not be matched.")
    skew_.add_argument("inputs", nargs="+", metavar="ROWS_TRACES_OR_RECORDS",
                       help="rows files (*.rows.parquet, *.rows), traces, AUTOANNOT_RECORD "
                       "files (*.jsonl), or folders of them")
    skew_.add_argument("-o", "--output", metavar="FILE", action="append",
                       help="write one row per instance to FILE (.json; .csv: one row per "
                       "instance and rank); may be repeated")
    skew_.add_argument("--force", action="store_true", help=FORCE_HELP)
    skew_.add_argument("--run", metavar="RUN", help="the run of the job to line up, where "
                       "record files hold several (they name each)")
    skew_.add_argument("--include-warmup", action="store_true",
                       help="count warm-up (profiler step 0 and each group's first "
                       "collective: start-up) in the ranking of who held the others up")
    skew_.add_argument("--top", type=int, default=10, metavar="N",
                       help="instances listed, by skew (default 10)")
    skew_.add_argument("--json", action="store_true", help="print JSON on stdout instead of text")
    skew_.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    skew_.add_argument("-j", "--jobs", type=_jobs, metavar="N",
                       help="traces read at once (default: the cores)")
    engine_arguments(skew_)
    skew_.set_defaults(func=skew.run)
    rep = sub.add_parser(
        "report", help="one self-contained HTML page of the whole job: who was late, the "
        "stragglers, bandwidth per group, agreement, one step's timeline",
        description="Line up every rank's collectives (as skew does: rows written in the job, "
        "*.rows.parquet or *.rows; traces; AUTOANNOT_RECORD files; or a mix) and write one HTML "
        "page that opens from disk with no network: missing ranks first, where the most "
        "waiting began, a heat map per group of its ranks x profiler steps, where each delay "
        "began with its call site, the stragglers, transfer time and bus bandwidth per group "
        "and dtype, whether the ranks agree, and one step's timeline rank by rank (needs numpy "
        "and plotly; pyarrow for Parquet rows). Exit 1 where ranks are missing or some "
        "collectives could not be matched (the page says which).")
    rep.add_argument("inputs", nargs="+", metavar="ROWS_TRACES_OR_RECORDS",
                     help="rows files (*.rows.parquet, *.rows), traces, AUTOANNOT_RECORD files "
                     "(*.jsonl), or folders of them")
    rep.add_argument("-o", "--output", required=True, metavar="HTML", help="the page (.html)")
    rep.add_argument("--include-warmup", action="store_true",
                       help="count warm-up (profiler step 0 and each group's first "
                       "collective: start-up) in the ranking of who held the others up")
    rep.add_argument("--title", help="the page's title")
    rep.add_argument("--instance", type=int, metavar="N", help="the instance whose step the "
                     "timeline shows (default: the one with the largest skew)")
    rep.add_argument("--run", metavar="RUN", help="the run of the job, where the inputs hold "
                     "several (they name each)")
    rep.add_argument("--force", action="store_true", help=FORCE_HELP)
    rep.add_argument("--json", action="store_true", help="print what the page leads with as "
                     "JSON on stdout (missing ranks, where the waiting began, per rank)")
    rep.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    rep.add_argument("-j", "--jobs", type=_jobs, metavar="N",
                     help="traces read at once (default: the cores)")
    engine_arguments(rep)
    rep.set_defaults(func=report.run)
    check_ = sub.add_parser(
        "check", help="do the ranks launch the same collectives in the same order?",
        description="Compare every rank's collective sequences, per captured graph and "
        "process group (ledgers, *.autoannot) and per process group eagerly (AUTOANNOT_RECORD "
        "files, *.jsonl; rows, *.rows.parquet and *.rows; or eager traces): ranks missing from "
        "a group first, then the first place each diverges, with each rank's collective, sizes, "
        "dtype and call site. Exit 1 if a rank is missing or any diverges.")
    check_.add_argument("inputs", nargs="+", metavar="LEDGERS_RECORDS_ROWS_OR_TRACES",
                       help="ledgers (*.autoannot), record files (*.jsonl), rows "
                       "(*.rows.parquet, *.rows), traces, or folders")
    check_.add_argument("--run", metavar="RUN", help="the run of the job to compare, where "
                       "record files or rows hold several (they name each)")
    check_.add_argument("--json", action="store_true", help="print JSON on stdout instead of text")
    check_.add_argument("-q", "--quiet", action="store_true",
                       help="no progress display (as every command takes; check shows none)")
    check_.set_defaults(func=check.run)
    plot_ = sub.add_parser("plot", help="a timeline picture: one band per rank, a lane per group",
                          description="Draw compute and each process group's collectives, "
                          "one band per rank (needs matplotlib).")
    plot_.add_argument("traces", nargs="+", metavar="TRACE", help=traces_help)
    plot_.add_argument("-o", "--output", required=True, metavar="PNG",
                      help="the picture (.png, .svg or .pdf)")
    plot_.add_argument("--title", help="the picture's title")
    plot_.add_argument("--force", action="store_true", help=FORCE_HELP)
    plot_.add_argument("--json", action="store_true", help="print JSON on stdout instead of text")
    plot_.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    plot_.set_defaults(func=plot.run)
    watch_ = sub.add_parser(
        "watch", help="name a live job's hang while it hangs, and its stragglers (the rings)",
        description="Look at the rings a job writes (AUTOANNOT_RING=FOLDER) while it runs: "
        "once no rank has launched a collective for --stall seconds, say the hang, as check "
        "says it: the rank that holds the job up, its last launch and call site, and who waits "
        "on it where. The rings must be on this host's disk; --store HOST:PORT reads instead "
        "the progress every rank publishes there (AUTOANNOT_WATCH_STORE), from any host. "
        "With no FOLDER: the newest run's rings of a job run with AUTOANNOT_WATCH=1 and no "
        "AUTOANNOT_RING (kept under the system's temporary folder). "
        "--once: what they show now (exit 0: no hang; 1: a hang; 2: bad input, or a ring that "
        "cannot be read, or none).")
    watch_command.add_arguments(watch_)
    watch_.set_defaults(func=watch_command.run)
    doc = sub.add_parser("doctor", help="versions, the annotation path, what is missing",
                         description="What this machine has, which annotation path the agent "
                         "will take, what is missing for torch's toolsId path and how to get "
                         "it, and whether the AUTOANNOT start-up hook would fire.")
    doc.add_argument("--json", action="store_true", help="print JSON on stdout instead of text")
    doc.set_defaults(func=commands.doctor)
    run = sub.add_parser("run", help="run a command with the agent on in every Python process",
                         description="Run CMD with AUTOANNOT=1 and the start-up hook on "
                         "PYTHONPATH, so every Python process it starts is instrumented. Put "
                         "-- before CMD when it has options of its own.")
    run.add_argument("--record", metavar="PATH", help="append each annotation as a JSON line "
                     "to PATH ({rank} and {pid} are filled in)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments")
    run.set_defaults(func=commands.run_instrumented)
    build = sub.add_parser(
        "build-native", help="compile the native observer for this torch (launches below the "
        "Python API seen through torch's RecordFunction callbacks, no dispatch key)",
        description="Compile autoannot's native observer against the installed torch (a C++ "
        "compiler and ninja; under a minute) into AUTOANNOT_NATIVE_DIR (default "
        "~/.cache/autoannot/native). The agent uses it from then on, unless AUTOANNOT_NATIVE=0.")
    build.add_argument("-v", "--verbose", action="store_true", help="show the compiler's output")
    build.set_defaults(func=commands.build_native)
    hook = sub.add_parser("hook-path", help="print the directory of the sitecustomize hook")
    hook.set_defaults(func=commands.hook_path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help(sys.stderr)
        return 2
    CREATED.clear()
    if hasattr(args, "quiet"):  # a trace command: a long read shows a bar on a terminal
        from autoannot.traces import progress

        try:
            progress.show(not args.quiet)
        except ValueError as exc:
            print(f"autoannot {args.subcommand}: {exc}", file=sys.stderr)
            return BAD_INPUT
    try:
        status = _run_command(args)
    except BrokenPipeError:  # `autoannot ... | head`: the reader left; leave quietly too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except BaseException as exc:
        if not _an_interrupt(exc):
            raise
        from autoannot.traces import files

        files.remove_temporary_files()
        remove_created()
        print(f"autoannot {args.subcommand}: interrupted (nothing half-written is left)",
              file=sys.stderr)
        return INTERRUPTED
    if status == BAD_INPUT:
        remove_created()
    return status


def _an_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C, or was raised by one: Python wraps what a class's
    ``__set_name__`` raises in a RuntimeError (3.11), so a Ctrl-C that lands while an import
    makes a class reaches the command as that error, caused by the interrupt."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


#: Whether ``main()`` runs as the process (``run()``): it then ends once the command has.
_ENDS_THE_PROCESS = False


def _run_command(args: argparse.Namespace) -> int:
    """``args.func(args)``; a Ctrl-C that came once its outputs were being put in place is
    held until it ends (``outputs.hold_interrupts``): the command ends with its own status."""
    from autoannot.traces import outputs

    try:
        status = args.func(args)
    finally:
        arrived = outputs.release_interrupts(signal.SIG_IGN if _ENDS_THE_PROCESS else None)
    if arrived:
        print(f"autoannot {args.subcommand}: the Ctrl-C came once the outputs were being put in "
              "place: they are whole, and the command ended", file=sys.stderr)
    return status


def run() -> None:
    """The ``autoannot`` command as a process runs it (``python -m autoannot``, the console
    script): ``main()``'s status as the exit status. An interrupted command (130) leaves within
    10 s whatever its exit waits on (``parallel.leave_after_interrupt``)."""
    from autoannot.traces import parallel

    global _ENDS_THE_PROCESS
    _ENDS_THE_PROCESS = True
    parallel.LEAVE_AFTER_INTERRUPT_S = 10.0
    parallel.prepare_workers()
    status = main()
    while True:  # (a Ctrl-C as the command ends changes nothing: what it did stands)
        try:
            if status == INTERRUPTED:
                parallel.leave_after_interrupt()
            else:  # (done: a Ctrl-C now, while Python ends, would kill it by the signal,
                # whose default Python puts back there, as though it had been interrupted)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            break
        except KeyboardInterrupt:  # (raised as the handler was being put in: put it again)
            continue
    sys.exit(status)


if __name__ == "__main__":
    run()

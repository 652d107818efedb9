"""The ``autoannot`` command line.

    autoannot annotate TRACE|DIR... [-o OUT]   give graphed NCCL kernels their eager args
    autoannot summary TRACE|DIR... [-o FILE]   per process group: what moved, how fast
    autoannot plot TRACE|DIR... -o PNG         a timeline picture, one band per rank
    autoannot doctor [--json]                  what this machine has, which path the agent takes
    autoannot run [--] CMD [ARGS...]           run CMD with every Python process instrumented
    autoannot build-native [-v]                compile the native observer for this torch
    autoannot hook-path                        the directory of the sitecustomize hook

The same option means the same thing in every command: ``-o`` names what is written (never an
input), ``--json`` prints JSON on stdout instead of text, ``-j`` the processes, ``-q`` no
progress. A folder stands for the traces in it.

Exit codes: 0 done; 1 done, but something was left undone or there was nothing to do
(reported); 2 bad input (nothing of that input written).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import autoannot

HOOK_DIR = Path(__file__).parent / "_hook"

FORCE_HELP = "write over an output file autoannot did not write (by default refused)"
DONE, INCOMPLETE, BAD_INPUT = 0, 1, 2
INTERRUPTED = 130  # (as a shell reports a command that SIGINT ended)


def _jobs(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value}: give 1 or more")
    return number


def _say(command: str, message: str) -> None:
    print(f"autoannot {command}: {message}", file=sys.stderr)


def _bad_input(command: str, message: str) -> int:
    """Say what is wrong in one line on stderr; return the exit code for bad input (2)."""
    _say(command, message)
    return BAD_INPUT


def _run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        return _bad_input("run", "give a command to run: autoannot run [--] CMD [ARGS...]")
    env = dict(os.environ, AUTOANNOT="1")
    if args.record:
        from autoannot.keep import journal

        try:
            journal.check_template(args.record)
        except journal.JournalError as exc:
            return _bad_input("run", str(exc).replace("AUTOANNOT_RECORD=", "--record "))
        env["AUTOANNOT_RECORD"] = args.record
    paths = [str(HOOK_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"autoannot run: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


def _build_native(args: argparse.Namespace) -> int:
    from autoannot import native

    try:
        existing = native.built_path()
        if existing is not None:
            print(existing)
            return DONE
        missing = native.missing_tools()
        if missing:
            _say("build-native", f"cannot build: {missing}")
            return INCOMPLETE
        sources = ", ".join(path.name for path in native.SOURCES)
        _say("build-native", f"compiling {sources} for torch into {native.build_dir()}"
             " (under a minute)")
        print(native.build(verbose=args.verbose))
    except Exception as exc:
        _say("build-native", f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
             + ("" if args.verbose else " (-v shows the compiler's output)"))
        return INCOMPLETE
    return DONE


def _annotate_plan(args: argparse.Namespace) -> tuple[list[Path], list[Path]]:
    """The traces to read and the outputs to write; TraceError for a plan that cannot be."""
    from autoannot.traces import files, paths

    skipped: list[str] = []
    traces = paths.expand(args.traces, skipped=skipped)
    for note in skipped:
        _say("annotate", note)
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
    _check_written([*traces, *([Path(args.ledger)] if args.ledger else [])], outputs,
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


def _annotate(args: argparse.Namespace) -> int:
    from autoannot.traces import files, parallel
    from autoannot.traces.read import annotate

    try:
        traces, outputs = _annotate_plan(args)
    except files.TraceError as exc:
        return _bad_input("annotate", str(exc))
    ledger = Path(args.ledger) if args.ledger else None
    jobs = [(trace, out, ledger, args.lanes, args.force)
            for trace, out in zip(traces, outputs, strict=True)]
    reports, status = [], DONE
    results = list(parallel.map_files(annotate.annotate_job, jobs, args.jobs,
                                      show=not args.quiet, name=lambda job: job[0],
                                      outcome=_outcome))
    from autoannot.traces import outputs as written

    written.remember([job[1] for job, result in zip(jobs, results, strict=True)  # (a JSON
                      if "report" in result and job[1].suffix == ".pftrace"],  # trace carries
                     "annotate")  # its marker)
    for (trace, out, *_), result in zip(jobs, results, strict=True):
        if "error" in result:
            _say("annotate", result["error"])
            reports.append({"trace": str(trace), "error": result["error"]})
            status = BAD_INPUT
            continue
        if "nothing" in result:
            _say("annotate", result["nothing"])
            reports.append({"trace": str(trace), "nothing": result["nothing"]})
            status = max(status, INCOMPLETE)
            continue
        report = result["report"]
        reports.append({**report, "output": str(out)})
        for problem in report["mismatches"]:
            print(f"{trace}: mismatch: {problem}", file=sys.stderr)
        for note in report["notes"]:
            print(f"{trace}: {note}", file=sys.stderr)
        if not _complete(report):
            status = max(status, INCOMPLETE)
        if not args.json:
            left = (f", {report['kernels_left']} of the trace's "
                    f"{report['graphed_nccl_kernels']} graphed NCCL kernels left unannotated"
                    if report["kernels_left"] else "")
            print(f"{trace} -> {out}: {report['kernels_annotated']}/"
                  f"{report['kernels_expected']} graphed NCCL kernels annotated in "
                  f"{report['launches_of_known_graphs']} replays ({report['order_resolved']} "
                  f"by capture order, {len(report['mismatches'])} mismatches{left})")
    if args.json:
        print(json.dumps(reports, indent=1))
    return status


#: Folders this command made for its outputs (taken away again, where empty, if it fails or is
#: interrupted: a failed command leaves nothing behind).
_CREATED: list[Path] = []


def _remove_created() -> None:
    for folder in sorted(_CREATED, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()  # (only where empty)
    _CREATED.clear()


def _check_written(inputs: list[Path], outputs: list[Path], force: bool) -> None:
    """Refuse outputs that are inputs, ledgers' names or files autoannot did not write (unless
    ``force``); create their folders (TraceError otherwise)."""
    from autoannot.traces import outputs as written
    from autoannot.traces import paths

    paths.check_outputs(inputs, outputs)
    written.check_replaceable(outputs, force)
    for out in outputs:
        _CREATED.extend(paths.make_parent(out))


def _not_json_or_csv(outputs: list[Path]) -> str:
    """What is wrong with ``-o`` files of rows (``.json`` or ``.csv``); '' if nothing."""
    for out in outputs:
        if out.suffix not in (".json", ".csv"):
            return f"-o {out}: name it .json or .csv"
    return ""


def _summary(args: argparse.Namespace) -> int:
    from autoannot.traces import files, paths
    from autoannot.traces.read import inputs as input_files
    from autoannot.traces.render import summary

    outputs = [Path(o) for o in args.output or []]
    wrong = _not_json_or_csv(outputs)
    if wrong:
        return _bad_input("summary", wrong)
    try:
        rows_files: list[Path] = []
        named, records = input_files.split(args.traces, rows_files,
                                           lambda m: _say("summary", m))
        skipped: list[str] = []
        traces = paths.expand(named, skip_outputs=False, skipped=skipped) if named else []
        _check_written([*traces, *records, *rows_files], outputs, args.force)
        from autoannot.traces.read import record_files, runs

        run = runs.choose(record_files.runs_in(records, rows_files), args.run)  # (one rule)
        for note in skipped:
            _say("summary", note)
        if traces and rows_files:  # (rows are what the job made of its traces: fewer facts)
            _say("summary", f"{len(rows_files)} rows files beside the traces: summarized from "
                 "the traces")
            rows_files = []
        result = (summary.summarize(traces, progress=not args.quiet, jobs=args.jobs) if traces
                  else summary.Summary([], [], []))
        if records:
            result.record_rows = summary.record_rows(records, run)
            result.notes = [n for n in result.notes if "AUTOANNOT_RECORD" not in n]
        if rows_files:
            from autoannot.traces.analysis import lineup
            from autoannot.traces.render import report

            try:
                result.instance_rows = report.group_rows(
                    lineup.analyze_files([], [], run=run, rows=rows_files))
            except ImportError:
                return _bad_input("summary", "rows files need numpy: pip install numpy")
    except FileNotFoundError as exc:
        return _bad_input("summary", f"{exc.args[0]}: no such file")
    except files.TraceError as exc:
        return _bad_input("summary", str(exc))
    for note in result.notes:
        _say("summary", note)
    from autoannot.traces import outputs as written

    rows = result.rows + result.cpu_rows + result.record_rows + result.instance_rows
    try:
        written.write_all({out: (lambda tmp: summary.write_csv(
                               result.rows or result.cpu_rows or result.record_rows
                               or result.instance_rows, tmp))
                           if out.suffix == ".csv" else
                           (lambda tmp: files.atomic_write_text(tmp, json.dumps(rows, indent=1)))
                           for out in outputs}, "summary")
    except OSError as exc:
        return _bad_input("summary", f"{exc.filename}: cannot write: {exc.strerror} (nothing "
                          "written)")
    if args.json:  # (after the files: a reader that leaves early loses none of them)
        print(json.dumps({"rows": result.rows, "cpu_rows": result.cpu_rows,
                          "record_rows": result.record_rows,
                          "instance_rows": result.instance_rows, "notes": result.notes},
                         indent=1))
    else:
        if result.rows:
            print(summary.format_table(result.rows))
        if result.cpu_rows:
            print(summary.format_cpu_table(result.cpu_rows))
        if result.record_rows:
            print(summary.format_record_table(result.record_rows))
        if result.instance_rows:
            print(summary.format_instance_table(result.instance_rows))
    return DONE if rows else INCOMPLETE


def _annotated_in(traces: list[Path], scratch: Path) -> list[Path]:
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


def _lined_up(command: str, args: argparse.Namespace,
              outputs: list[Path]) -> tuple[Any, list[Path]]:
    """``skew``'s and ``report``'s analysis of their inputs (rows, traces, record files), and
    the inputs; or the exit status where there is none to make."""
    from autoannot.traces import files
    from autoannot.traces.analysis import lineup
    from autoannot.traces.read import inputs as input_files

    try:
        traces, records, rows = input_files.cross_rank(args.inputs,
                                                         lambda m: _say(command, m))
        inputs = [*rows, *traces, *records]
        # never written over, even with --force: any file given, or in a folder given
        _check_written([*inputs, *input_files.every_file(args.inputs)], outputs, args.force)
        with tempfile.TemporaryDirectory(prefix=f"autoannot-{command}-") as scratch:
            readable = _annotated_in(traces, Path(scratch))
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
        return _bad_input(command, f"{exc.args[0]}: no such file"), []
    except files.TraceError as exc:
        return _bad_input(command, str(exc)), []
    if len(analysis.ranks) < 2:
        _say(command, f"one rank's inputs ({', '.join(map(str, inputs))}): give every rank's "
             "rows, trace or record file to line its collectives up")
        return INCOMPLETE, inputs
    return analysis, inputs


def _engine(args: argparse.Namespace) -> Any:
    """The engine asked for: this machine's (``-j``), or Dask's."""
    from autoannot.traces.analysis import engines

    return engines.make(args.engine, getattr(args, "jobs", None), args.scheduler, args.workers,
                        args.worker_memory, progress=not args.quiet)


def _engine_arguments(command: argparse.ArgumentParser) -> None:
    engine = command.add_argument_group(
        "engine", "where the analysis runs: this machine (embedded, the default: partitions "
        "of rows read one at a time on its cores, for rows beyond its memory too) or a Dask "
        "cluster (pip install 'autoannot[dask]'; every worker must see the rows files)")
    engine.add_argument("--engine", choices=("embedded", "dask"), default="embedded",
                        help="embedded (default) or dask")
    engine.add_argument("--scheduler", metavar="ADDRESS",
                        help="the Dask scheduler (tcp://host:8786; default: "
                        "$DASK_SCHEDULER_ADDRESS, else a local cluster)")
    engine.add_argument("--workers", type=_jobs, metavar="N",
                        help="worker processes of the local Dask cluster (default 4)")
    engine.add_argument("--worker-memory", metavar="SIZE",
                        help="each local Dask worker's memory limit (2GB, ...; default: "
                        "this machine's memory shared out)")
    engine.add_argument("--partition-launches", type=_jobs, metavar="N",
                        help="launches a partition holds, about (default: a job of up to "
                        "24,000,000 run here is one, read once; else 4,000,000: ~600 MB a "
                        "partition task)")


def _skew(args: argparse.Namespace) -> int:
    from autoannot.traces.render import skew

    outputs = [Path(o) for o in args.output or []]
    wrong = _not_json_or_csv(outputs)
    if wrong:
        return _bad_input("skew", wrong)
    analysis, _ = _lined_up("skew", args, outputs)
    if isinstance(analysis, int):
        return analysis
    from autoannot.traces import outputs as written

    try:
        written.write_all({out: (lambda tmp, write=(skew.write_csv if out.suffix == ".csv"
                                                     else skew.write_json):
                                 write(analysis, tmp))
                           for out in outputs}, "skew")
    except OSError as exc:
        return _bad_input("skew", f"{exc.filename}: cannot write: {exc.strerror} (nothing "
                          "written)")
    if args.json:  # (after the files: a reader that leaves early loses none of them)
        print(json.dumps({"lead": skew.lead(analysis), "hang": analysis.hang,
                          "missing": analysis.missing, "origins": analysis.origins(args.top),
                          "instances": analysis.rows(), "ranks": analysis.per_rank(),
                          "clocks": [c.__dict__ for c in analysis.clocks],
                          "problems": analysis.problems, "notes": analysis.notes}, indent=1))
    else:
        print(skew.format_report(analysis, args.top))
    if not analysis.instances:
        _say("skew", "no collective instance across ranks in these inputs")
        return INCOMPLETE
    if analysis.missing:
        from autoannot.traces.analysis.matching import count

        _say("skew", f"ranks are missing from {count(len(analysis.missing), 'group')} (named "
             "above)")
        return INCOMPLETE
    return INCOMPLETE if analysis.problems else DONE


def _check(args: argparse.Namespace) -> int:
    from autoannot.traces import files
    from autoannot.traces.analysis import sequences
    from autoannot.traces.read import inputs as input_files

    try:
        inputs = input_files.to_check(args.inputs)
        missing: list[str] = []
        hang_lead: list[str] = []
        divergences, compared, ranks = sequences.check_files(inputs, args.run, missing,
                                                             hang_lead)
    except files.TraceError as exc:
        return _bad_input("check", str(exc))
    if args.json:
        print(json.dumps({"ranks": ranks, "sequences_compared": compared, "hang": hang_lead,
                          "missing": missing,
                          "divergences": [d.as_dict() for d in divergences]}, indent=1))
    else:
        from autoannot.traces.analysis.matching import count

        for line in hang_lead:
            print(line)
        for line in missing:
            print(f"MISSING: {line}")
        for divergence in divergences:
            print(f"DIVERGES: {divergence.describe()}")
        print(f"{compared} sequences (graph or eager, per process group) compared across "
              f"{ranks} ranks: {len(divergences)} diverge"
              + (f"; ranks missing from {count(len(missing), 'group')}" if missing else ""))
    if not compared:
        _say("check", "nothing to compare: give two ranks' ledgers, record files or traces")
        return INCOMPLETE
    return INCOMPLETE if divergences or missing or hang_lead else DONE


def _report(args: argparse.Namespace) -> int:
    from autoannot.traces import files
    from autoannot.traces.render import skew

    output = Path(args.output)
    if output.suffix not in (".html", ".htm"):
        return _bad_input("report", f"-o {output}: name it .html")
    try:
        import numpy  # noqa: F401
        import plotly  # noqa: F401
    except ImportError as exc:
        return _bad_input("report", f"needs numpy and plotly ({exc.name} is missing): pip "
                          "install 'autoannot[report]'")
    analysis, inputs = _lined_up("report", args, [output])
    if isinstance(analysis, int):
        return analysis
    if args.instance is not None and not 0 <= args.instance < len(analysis.instances):
        return _bad_input("report", f"--instance {args.instance}: there are "
                          f"{len(analysis.instances)} instances (0-{len(analysis.instances) - 1})")
    from autoannot.traces import outputs as written
    from autoannot.traces.render import report

    names = [str(p) for p in inputs]
    try:
        written.write_all({output: lambda tmp: files.atomic_write_text(
            str(tmp), report.render(analysis, names, args.title, args.instance))}, "report")
    except OSError as exc:
        return _bad_input("report", f"{exc.filename}: cannot write: {exc.strerror} (nothing "
                          "written)")
    lead = skew.lead(analysis)
    if args.json:
        print(json.dumps({"output": str(output), "instances": len(analysis.instances),
                          "ranks": analysis.per_rank(), "lead": lead, "hang": analysis.hang,
                          "missing": analysis.missing, "origins": analysis.origins(),
                          "problems": analysis.problems, "notes": analysis.notes}, indent=1))
    else:
        print(f"{output}: {len(analysis.instances)} instances on {len(analysis.ranks)} ranks; "
              f"{len(analysis.problems)} not matched")
        for line in lead:
            print(f"  {line}")
    return (INCOMPLETE if analysis.problems or analysis.missing or not analysis.instances
            else DONE)


def _plot(args: argparse.Namespace) -> int:
    from autoannot.traces import files, paths

    output = Path(args.output)
    if output.suffix not in (".png", ".svg", ".pdf"):
        return _bad_input("plot", f"-o {output}: name it .png, .svg or .pdf")
    try:
        skipped: list[str] = []
        traces = paths.expand(args.traces, skip_outputs=False, skipped=skipped)
        _check_written(traces, [output], args.force)
        for note in skipped:
            _say("plot", note)
    except files.TraceError as exc:
        return _bad_input("plot", str(exc))
    from autoannot.traces import outputs as written
    from autoannot.traces.render import plot  # matplotlib itself is imported when drawing

    drawn: dict[str, Any] = {}
    try:
        written.write_all({output: lambda tmp: drawn.update(plot.plot(traces, tmp, args.title,
                                                                      output.suffix))},
                          "plot")
    except ImportError:
        return _bad_input("plot", "needs matplotlib: pip install matplotlib")
    except plot.NothingToDraw as exc:
        _say("plot", str(exc))
        return INCOMPLETE
    except files.TraceError as exc:
        return _bad_input("plot", str(exc))
    except OSError as exc:
        return _bad_input("plot", f"{output}: cannot write: {exc.strerror}")
    if args.json:
        print(json.dumps({"output": str(output), **drawn}, indent=1))
    else:
        print(f"{output}: {drawn['ranks']} ranks, {drawn['lanes']} lanes, {drawn['kernels']} "
              "kernels")
    return DONE


def _watch(args: argparse.Namespace) -> int:
    """``autoannot watch FOLDER``: the rings' hang said while the job runs; ``--once``: what
    they show now."""
    from autoannot.live import watch
    from autoannot.traces import files

    source: Any
    if args.store is not None:  # the progress the ranks publish (AUTOANNOT_WATCH_STORE)
        from autoannot.base import config
        from autoannot.live.publish import connect

        try:
            address = config.watch_store({"AUTOANNOT_WATCH_STORE": args.store})
            assert address is not None
            source = watch.StoreProgress(connect(address), f"{address[0]}:{address[1]}")
        except ValueError as exc:
            return _bad_input("watch", f"--store: {str(exc).split('=', 1)[-1]}")
        except Exception as exc:  # (torch's store: nothing answers there)
            return _bad_input("watch", f"--store {args.store}: no store answers "
                              f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")
    else:
        if args.folder is None:  # the newest run of a job that kept its rings where the
            from autoannot.base import run_folders  # watch keeps them (AUTOANNOT_RING unset)

            folder = watch.newest_run(args.interval, lambda line: print(line, flush=True),
                                      attached=not args.once)
            if folder is None:
                return _bad_input("watch", f"give AUTOANNOT_RING's folder, or --store HOST:PORT "
                                  f"(no run's rings under {run_folders.root()}, where a job "
                                  "run with AUTOANNOT_WATCH=1 alone keeps them)")
            print(f"autoannot watch: the newest run's rings, {folder}",
                  file=sys.stderr if args.once else sys.stdout, flush=True)
        else:
            folder = Path(args.folder)
        if not folder.is_dir():
            return _bad_input("watch", f"{folder}: no such folder (give AUTOANNOT_RING's "
                              "folder)")
        source = watch.RingsFolder(folder)
    if args.once:
        try:
            code, said, found = watch.once(source)
        except files.TraceError as exc:
            return _bad_input("watch", str(exc))
        for note in found.notes + found.unreadable:
            _say("watch", note)
        if args.json:
            print(json.dumps({"run": found.run, "ranks": sorted(found.counts),
                              "launches": {str(r): n for r, n in sorted(found.counts.items())},
                              "hang": found.lines, "notes": found.notes,
                              "unreadable": found.unreadable}, indent=1))
        elif said:
            print("\n".join(said))
        return code
    metrics = None
    if args.prometheus is not None:
        from autoannot.live.metrics import JobMetrics

        try:
            metrics = JobMetrics(lambda line: print(line, flush=True))
            metrics.serve(args.prometheus)
        except ImportError:
            return _bad_input("watch", "--prometheus needs prometheus-client (pip install "
                              "'autoannot[watch]')")
        except OSError as exc:
            return _bad_input("watch", f"--prometheus {args.prometheus}: {exc.strerror or exc}")
        print(f"autoannot watch: Prometheus metrics on port {args.prometheus} (/metrics)",
              flush=True)
    watcher = watch.Watcher(source, args.stall, lambda line: print(line, flush=True),
                            metrics=metrics)
    print(f"autoannot watch: {source}, a look every {args.interval:g} s; a hang is said once "
          f"no rank has launched for {args.stall:g} s (Ctrl-C ends)", flush=True)
    watcher.run(args.interval)
    return 0


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is no number of seconds") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{value!r}: must be more than 0")
    return seconds


def _doctor(args: argparse.Namespace) -> int:
    from autoannot.agent import doctor

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

    annotate = sub.add_parser(
        "annotate", help="give graphed NCCL kernels the args of their eager kernels",
        description="Give every graphed NCCL kernel the args of its eager kernel, from the "
        "ledger each rank wrote next to its trace (NAME.autoannot), leaving it where it ran. "
        "Exit 0: every graphed NCCL kernel annotated; 1: some left (reported) or nothing to "
        "annotate; 2: bad input.")
    annotate.add_argument("traces", nargs="+", metavar="TRACE", help=traces_help)
    annotate.add_argument("-o", "--output", metavar="OUT",
                          help="output file (one trace) or folder (any number: their layout "
                          "is kept); default: annotated/NAME next to each trace")
    annotate.add_argument("--format", choices=("json", "json.gz", "pftrace"),
                          help="output format (default: the -o name's, else the trace's); "
                          "pftrace: Perfetto")
    annotate.add_argument("--ledger", metavar="LEDGER",
                          help="the ledger file, when it is not next to the (single) trace")
    annotate.add_argument("--force", action="store_true",
                          help="use a ledger that does not belong to the trace (another rank "
                          "or process, other graphs), and write over outputs autoannot did not "
                          "write")
    annotate.add_argument("--lanes", action="store_true",
                          help="move each annotated kernel to its process group's lane (one row "
                               "per group in a viewer; stream-based analyses then change)")
    common(annotate, "traces annotated")
    annotate.set_defaults(func=_annotate)
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
    summ.set_defaults(func=_summary)
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
    _engine_arguments(skew_)
    skew_.set_defaults(func=_skew)
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
    _engine_arguments(rep)
    rep.set_defaults(func=_report)
    check = sub.add_parser(
        "check", help="do the ranks launch the same collectives in the same order?",
        description="Compare every rank's collective sequences, per captured graph and "
        "process group (ledgers, *.autoannot) and per process group eagerly (AUTOANNOT_RECORD "
        "files, *.jsonl; rows, *.rows.parquet and *.rows; or eager traces): ranks missing from "
        "a group first, then the first place each diverges, with each rank's collective, sizes, "
        "dtype and call site. Exit 1 if a rank is missing or any diverges.")
    check.add_argument("inputs", nargs="+", metavar="LEDGERS_RECORDS_ROWS_OR_TRACES",
                       help="ledgers (*.autoannot), record files (*.jsonl), rows "
                       "(*.rows.parquet, *.rows), traces, or folders")
    check.add_argument("--run", metavar="RUN", help="the run of the job to compare, where "
                       "record files or rows hold several (they name each)")
    check.add_argument("--json", action="store_true", help="print JSON on stdout instead of text")
    check.add_argument("-q", "--quiet", action="store_true",
                       help="no progress display (as every command takes; check shows none)")
    check.set_defaults(func=_check)
    plot = sub.add_parser("plot", help="a timeline picture: one band per rank, a lane per group",
                          description="Draw compute and each process group's collectives, "
                          "one band per rank (needs matplotlib).")
    plot.add_argument("traces", nargs="+", metavar="TRACE", help=traces_help)
    plot.add_argument("-o", "--output", required=True, metavar="PNG",
                      help="the picture (.png, .svg or .pdf)")
    plot.add_argument("--title", help="the picture's title")
    plot.add_argument("--force", action="store_true", help=FORCE_HELP)
    plot.add_argument("--json", action="store_true", help="print JSON on stdout instead of text")
    plot.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    plot.set_defaults(func=_plot)
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
    watch_.add_argument("folder", metavar="FOLDER", nargs="?",
                        help="AUTOANNOT_RING's folder (default: the newest run's rings)")
    watch_.add_argument("--store", metavar="HOST:PORT",
                        help="the c10d store (a TCPStore) the ranks publish their progress to")
    watch_.add_argument("--interval", type=_seconds, default=1.0, metavar="S",
                        help="seconds between looks (default 1)")
    watch_.add_argument("--stall", type=_seconds, default=5.0, metavar="S",
                        help="seconds with no launch on any rank before a hang is said "
                        "(default 5)")
    watch_.add_argument("--once", action="store_true", help="look once, say it, and exit")
    watch_.add_argument("--prometheus", type=int, metavar="PORT",
                        help="serve the job's metrics for Prometheus on PORT (/metrics)")
    watch_.add_argument("--json", action="store_true", help="with --once: JSON on stdout")
    watch_.set_defaults(func=_watch)
    doc = sub.add_parser("doctor", help="versions, the annotation path, what is missing",
                         description="What this machine has, which annotation path the agent "
                         "will take, what is missing for torch's toolsId path and how to get "
                         "it, and whether the AUTOANNOT start-up hook would fire.")
    doc.add_argument("--json", action="store_true", help="print JSON on stdout instead of text")
    doc.set_defaults(func=_doctor)
    run = sub.add_parser("run", help="run a command with the agent on in every Python process",
                         description="Run CMD with AUTOANNOT=1 and the start-up hook on "
                         "PYTHONPATH, so every Python process it starts is instrumented. Put "
                         "-- before CMD when it has options of its own.")
    run.add_argument("--record", metavar="PATH", help="append each annotation as a JSON line "
                     "to PATH ({rank} and {pid} are filled in)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments")
    run.set_defaults(func=_run)
    build = sub.add_parser(
        "build-native", help="compile the native observer for this torch (launches below the "
        "Python API seen through torch's RecordFunction callbacks, no dispatch key)",
        description="Compile autoannot's native observer against the installed torch (a C++ "
        "compiler and ninja; under a minute) into AUTOANNOT_NATIVE_DIR (default "
        "~/.cache/autoannot/native). The agent uses it from then on, unless AUTOANNOT_NATIVE=0.")
    build.add_argument("-v", "--verbose", action="store_true", help="show the compiler's output")
    build.set_defaults(func=_build_native)
    hook = sub.add_parser("hook-path", help="print the directory of the sitecustomize hook")
    hook.set_defaults(func=_hook_path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help(sys.stderr)
        return 2
    _CREATED.clear()
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
        _remove_created()
        print(f"autoannot {args.subcommand}: interrupted (nothing half-written is left)",
              file=sys.stderr)
        return INTERRUPTED
    if status == BAD_INPUT:
        _remove_created()
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

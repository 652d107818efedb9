"""``autoannot watch [FOLDER | --store HOST:PORT] [--once]``: a live job's hang and stragglers,
from outside the job (``live.watch``, as rank 0's thread watches it from inside)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from autoannot.traces.commands.common import bad_input, say


def run(args: argparse.Namespace) -> int:
    from autoannot.live import watch
    from autoannot.traces import files

    source = _source(args)
    if isinstance(source, int):
        return source
    if args.once:
        try:
            code, said, found = watch.once(source)
        except files.TraceError as exc:
            return bad_input("watch", str(exc))
        for note in found.notes + found.unreadable:
            say("watch", note)
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
        try:
            metrics = watch.served_metrics(args.prometheus, _print)
        except ImportError:
            return bad_input("watch", "--prometheus needs prometheus-client (pip install "
                             "'autoannot[watch]')")
        except OSError as exc:
            return bad_input("watch", f"--prometheus {args.prometheus}: {exc.strerror or exc}")
    watcher = watch.Watcher(source, args.stall, _print, metrics=metrics)
    _print(f"autoannot watch: {source}, a look every {args.interval:g} s; a hang is said once "
           f"no rank has launched for {args.stall:g} s (Ctrl-C ends)")
    watcher.run(args.interval)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments."""
    parser.add_argument("folder", metavar="FOLDER", nargs="?",
                        help="AUTOANNOT_RING's folder (default: the newest run's rings)")
    parser.add_argument("--store", metavar="HOST:PORT",
                        help="the c10d store (a TCPStore) the ranks publish their progress to")
    parser.add_argument("--interval", type=seconds, default=1.0, metavar="S",
                        help="seconds between looks (default 1)")
    parser.add_argument("--stall", type=seconds, default=5.0, metavar="S",
                        help="seconds with no launch on any rank before a hang is said "
                        "(default 5)")
    parser.add_argument("--once", action="store_true", help="look once, say it, and exit")
    parser.add_argument("--prometheus", type=int, metavar="PORT",
                        help="serve the job's metrics for Prometheus on PORT (/metrics)")
    parser.add_argument("--json", action="store_true", help="with --once: JSON on stdout")


def seconds(value: str) -> float:
    """An argument of seconds, more than 0 (``--interval``, ``--stall``)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is no number of seconds") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"{value!r}: must be more than 0")
    return number


def _print(line: str) -> None:
    print(line, flush=True)


def _source(args: argparse.Namespace) -> Any:
    """What the command watches: the store's published progress, a folder of rings, or the
    newest run's rings; the exit status where there is none (said)."""
    from autoannot.live import watch

    if args.store is not None:  # the progress the ranks publish (AUTOANNOT_WATCH_STORE)
        from autoannot.base import config

        try:
            address = config.watch_store({"AUTOANNOT_WATCH_STORE": args.store})
            assert address is not None
            return watch.store_source(address)
        except ValueError as exc:
            return bad_input("watch", f"--store: {str(exc).split('=', 1)[-1]}")
        except Exception as exc:  # (torch's store: nothing answers there)
            return bad_input("watch", f"--store {args.store}: no store answers "
                             f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")
    if args.folder is None:  # the newest run of a job that kept its rings where the watch
        from autoannot.base import run_folders  # keeps them (AUTOANNOT_RING unset)

        folder = watch.newest_run(args.interval, _print, attached=not args.once)
        if folder is None:
            return bad_input("watch", f"give AUTOANNOT_RING's folder, or --store HOST:PORT (no "
                             f"run's rings under {run_folders.root()}, where a job run with "
                             "AUTOANNOT_WATCH=1 alone keeps them)")
        print(f"autoannot watch: the newest run's rings, {folder}",
              file=sys.stderr if args.once else sys.stdout, flush=True)
    else:
        folder = Path(args.folder)
    if not folder.is_dir():
        return bad_input("watch", f"{folder}: no such folder (give AUTOANNOT_RING's folder)")
    return watch.RingsFolder(folder, args.stall)

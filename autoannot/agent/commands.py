"""The commands of the agent itself: ``autoannot run`` (a command with every Python process in it
instrumented), ``build-native``, ``doctor`` and ``hook-path``; from an ``argparse.Namespace``
to an exit status, as the trace tools' commands (``traces.commands``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from autoannot.traces.commands.common import DONE, INCOMPLETE, bad_input, say

#: The folder of the ``sitecustomize`` start-up hook (``autoannot run`` puts it on PYTHONPATH).
HOOK_DIR = Path(__file__).parents[1] / "_hook"


def run_instrumented(args: argparse.Namespace) -> int:
    """``autoannot run [--] CMD``: CMD in place of this process, with ``AUTOANNOT=1`` and the
    start-up hook on PYTHONPATH (127 where it cannot be run)."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        return bad_input("run", "give a command to run: autoannot run [--] CMD [ARGS...]")
    env = dict(os.environ, AUTOANNOT="1")
    if args.record:
        from autoannot.keep import journal

        try:
            journal.check_template(args.record)
        except journal.JournalError as exc:
            return bad_input("run", str(exc).replace("AUTOANNOT_RECORD=", "--record "))
        env["AUTOANNOT_RECORD"] = args.record
    paths = [str(HOOK_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"autoannot run: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


def build_native(args: argparse.Namespace) -> int:
    """``autoannot build-native``: the native module compiled for this torch (its path)."""
    from autoannot import native

    try:
        existing = native.built_path()
        if existing is not None:
            print(existing)
            return DONE
        missing = native.missing_tools()
        if missing:
            say("build-native", f"cannot build: {missing}")
            return INCOMPLETE
        sources = ", ".join(path.name for path in native.SOURCES)
        say("build-native", f"compiling {sources} for torch into {native.build_dir()}"
            " (under a minute)")
        print(native.build(verbose=args.verbose))
    except Exception as exc:
        say("build-native", f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
            + ("" if args.verbose else " (-v shows the compiler's output)"))
        return INCOMPLETE
    return DONE


def doctor(args: argparse.Namespace) -> int:
    """``autoannot doctor``: what this machine has and which path the agent takes."""
    from autoannot.agent import doctor as diagnosis

    report = diagnosis.diagnose()
    print(json.dumps(report, indent=1) if args.json else diagnosis.format_report(report))
    return 0


def hook_path(args: argparse.Namespace) -> int:
    """``autoannot hook-path``: the start-up hook's folder."""
    print(HOOK_DIR)
    return 0

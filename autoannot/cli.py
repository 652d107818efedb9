"""The ``autoannot`` command line.

    autoannot run CMD [ARGS...]   run CMD with every Python process in it instrumented
    autoannot hook-path           the directory to put first on PYTHONPATH (sitecustomize hook)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import autoannot

HOOK_DIR = Path(__file__).parent / "_hook"


def _run(args: argparse.Namespace) -> int:
    if not args.command:
        print("autoannot run: give a command to run", file=sys.stderr)
        return 2
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
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

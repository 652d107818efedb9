"""What every trace command shares: its exit statuses, how it says a problem, and the outputs it
may write (never an input; folders it made taken away again where it fails)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

DONE, INCOMPLETE, BAD_INPUT = 0, 1, 2
INTERRUPTED = 130  # (as a shell reports a command that SIGINT ended)
FORCE_HELP = "write over an output file autoannot did not write (by default refused)"

#: Folders this command made for its outputs (taken away again, where empty, if it fails or is
#: interrupted: a failed command leaves nothing behind).
CREATED: list[Path] = []


def say(command: str, message: str) -> None:
    print(f"autoannot {command}: {message}", file=sys.stderr)


def bad_input(command: str, message: str) -> int:
    """Say what is wrong in one line on stderr; return the exit code for bad input (2)."""
    say(command, message)
    return BAD_INPUT


def remove_created() -> None:
    for folder in sorted(CREATED, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()  # (only where empty)
    CREATED.clear()


def check_written(inputs: list[Path], outputs: list[Path], force: bool) -> None:
    """Refuse outputs that are inputs, ledgers' names or files autoannot did not write (unless
    ``force``); create their folders (TraceError otherwise)."""
    from autoannot.traces import outputs as written
    from autoannot.traces import paths

    paths.check_outputs(inputs, outputs)
    written.check_replaceable(outputs, force)
    for out in outputs:
        CREATED.extend(paths.make_parent(out))


def not_json_or_csv(outputs: list[Path]) -> str:
    """What is wrong with ``-o`` files of rows (``.json`` or ``.csv``); '' if nothing."""
    for out in outputs:
        if out.suffix not in (".json", ".csv"):
            return f"-o {out}: name it .json or .csv"
    return ""


def write_outputs(command: str, writers: dict[Path, Any]) -> int | None:
    """Put every output in place at once (``outputs.write_all``: each ``writers[out](tmp)``
    writes it); the exit status where one cannot be written (nothing is), else None."""
    from autoannot.traces import outputs as written

    try:
        written.write_all(writers, command)
    except OSError as exc:
        return bad_input(command, f"{exc.filename}: cannot write: {exc.strerror} (nothing "
                         "written)")
    return None


def positive(value: str) -> int:
    """An argument of 1 or more (``-j``, ``--workers``)."""
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value}: give 1 or more")
    return number

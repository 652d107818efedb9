"""What the trace commands may write over: nothing but a file autoannot itself wrote.

A command writes an output where nothing is, or over a file autoannot wrote: an annotated trace
(it carries ``files.MARKER``) or a file listed, with its size and modification time, in the
folder's ``.autoannot_written`` (row files, pictures, Perfetto traces: formats with no place for
a marker). Anything else — a raw trace, a ledger, a framework's file — needs ``--force``. A
command's outputs are checked, and their temporary files made, before any is written: where one
cannot be written, none is (``write_all``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoannot.traces.files import TraceError, annotated_from, remove_quietly, temporary_file

#: The list of files autoannot wrote in a folder (no ``.json`` ending: never read as a trace).
SIDECAR = ".autoannot_written"
#: Names an output never takes: ledgers (``annotate`` finds a trace's by them).
LEDGER_ENDINGS = (".autoannot", ".autoannot.json")


def _listed(folder: Path) -> dict[str, Any]:
    try:
        listed = json.loads((folder / SIDECAR).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return listed if isinstance(listed, dict) else {}


def written_by_autoannot(path: Path) -> str | None:
    """The command that wrote ``path`` (``"annotate"`` for a marked trace), or None where
    autoannot did not write it (or it changed since)."""
    if path.name.endswith((".json", ".json.gz")) and annotated_from(path) is not None:
        return "annotate"
    entry = _listed(path.parent).get(path.name)
    if not isinstance(entry, dict):
        return None
    try:
        stat = path.stat()
    except OSError:
        return None
    if entry.get("size") == stat.st_size and entry.get("mtime_ns") == stat.st_mtime_ns:
        return str(entry.get("by", "autoannot"))
    return None


def check_replaceable(outputs: list[Path], force: bool) -> None:
    """Raise TraceError for an output that may not be written: a ledger's name, a folder, or a
    file autoannot did not write (unless ``force``)."""
    for out in outputs:
        if out.name.endswith(LEDGER_ENDINGS) or out.name == SIDECAR:
            raise TraceError(f"{out}: a ledger's name (*.autoannot): choose another output name")
        if out.is_dir():
            raise TraceError(f"{out}: is a folder")
        if out.exists() and not force and written_by_autoannot(out) is None:
            raise TraceError(f"{out}: exists, and autoannot did not write it: refusing to write "
                             "over it (--force replaces it)")


def remember(paths: list[Path], command: str) -> None:
    """List ``paths`` (written by ``command``) in their folders' ``.autoannot_written``. A
    folder where the list cannot be written is left as it is (its files then need --force)."""
    by_folder: dict[Path, list[Path]] = {}
    for path in paths:
        by_folder.setdefault(path.parent, []).append(path)
    for folder, written in by_folder.items():
        listed = _listed(folder)
        for path in written:
            with contextlib.suppress(OSError):
                stat = path.stat()
                listed[path.name] = {"by": command, "size": stat.st_size,
                                     "mtime_ns": stat.st_mtime_ns}
        listed = {name: entry for name, entry in listed.items() if (folder / name).exists()}
        with contextlib.suppress(OSError):
            from autoannot.traces.files import atomic_write_text

            atomic_write_text(folder / SIDECAR, json.dumps(listed, indent=1, sort_keys=True))


def listed_outputs(folder: Path) -> dict[str, str]:
    """The files of ``folder`` that autoannot wrote and that are unchanged: name -> command."""
    found = {}
    for name in _listed(folder):
        by = written_by_autoannot(folder / name)
        if by is not None:
            found[name] = by
    return found


def write_all(outputs: dict[Path, Callable[[Path], None]], command: str) -> None:
    """Write each output through ``write(temporary_path)``; a temporary file for every output is
    made first (an output that cannot be written fails the command before any is), and each
    is renamed into place once all are written. Raises OSError naming the output."""
    temporaries: dict[Path, str] = {}
    try:
        for out in outputs:
            folder = os.path.dirname(os.path.abspath(out))
            try:
                fd, tmp = temporary_file(folder)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, os.fspath(out)) from None
            os.close(fd)
            temporaries[out] = tmp
        for out, write in outputs.items():
            try:
                write(Path(temporaries[out]))
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, os.fspath(out)) from None
        hold_interrupts()
        for out, tmp in temporaries.items():
            os.replace(tmp, out)
    finally:
        for tmp in temporaries.values():
            if os.path.exists(tmp):
                remove_quietly(tmp)
    remember(list(outputs), command)


#: Ctrl-Cs that came while held (``hold_interrupts``), and the handler the hold replaced; None
#: while nothing is held.
_HELD: dict[str, Any] | None = None


def hold_interrupts() -> None:
    """From here until ``release_interrupts()``, a Ctrl-C is noted, not raised: a command's
    outputs are being put in place, and once they are, its work stands (an interrupt then would
    end it as "interrupted" beside whole outputs). Only the main thread can hold them."""
    global _HELD
    if _HELD is not None:
        return
    held: dict[str, Any] = {"arrived": 0}

    def note(signum: int, frame: Any) -> None:
        held["arrived"] += 1

    try:
        held["previous"] = signal.signal(signal.SIGINT, note)
    except ValueError:  # (not the main thread: nothing to hold)
        return
    _HELD = held


def release_interrupts(then: Any = None) -> int:
    """Put back the handler ``hold_interrupts`` replaced (or put in ``then``: a process that
    ends now ignores Ctrl-C, with no moment for one to be raised); the number of Ctrl-Cs that
    came while they were held (dropped: the outputs stand)."""
    global _HELD
    held, _HELD = _HELD, None
    if held is None:
        return 0
    signal.signal(signal.SIGINT, held["previous"] if then is None else then)
    return int(held["arrived"])

"""Which files a cross-rank command reads: the traces, record files, rows files, rings
(``AUTOANNOT_RING``'s) and Flight Recorder dumps named
(files, or folders of them), each kind apart; a trace read through the rows written beside
it; what ``check`` compares; every file a command may read (never to be written over)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from autoannot.traces import outputs, paths
from autoannot.traces.read import flight_recorder, ring_files
from autoannot.traces.table.rows import PARQUET_SUFFIX, SUFFIX, is_rows, is_rows_name, rows_beside

ROWS_SUFFIXES = (SUFFIX, PARQUET_SUFFIX)


def _silent(message: str) -> None:
    """Say nothing (where the caller says nothing of what is skipped)."""


def split(arguments: list[str], rows: list[Path] | None = None,
          say: Callable[[str], None] = _silent) -> tuple[list[str], list[Path]]:
    """Record files (``*.jsonl``, and folders' ``*.jsonl``) apart from traces; rows files
    (``*.rows``, folders' too) into ``rows`` where given. In folders, anything that is no
    regular file (a FIFO, a socket) is skipped, said, and never opened."""
    traces, records = [], []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            with os.scandir(path) as listing:  # (one listing: thousands of ranks' files)
                entries = sorted(listing, key=lambda entry: entry.name)
            dumps = {e.path for e in entries if rows is not None and not e.name.endswith(
                (".jsonl", *ROWS_SUFFIXES)) and e.is_file() and (
                    ring_files.is_ring(e.name) or flight_recorder.is_dump(e.path))}
            if rows is not None:  # (torch's Flight Recorder dumps: read as a rank's rows)
                rows += [Path(e.path) for e in entries if e.path in dumps]
            found = [e for e in entries if e.name.endswith((".jsonl", *ROWS_SUFFIXES))]
            for odd in (e for e in found if not e.is_file()):
                say(f"{odd.path}: not a regular file (a FIFO or socket?): skipped")
            found = [e for e in found if e.is_file()]
            inside = [Path(e.path) for e in found if e.name.endswith(".jsonl")]
            records += inside
            found_rows = [] if rows is None else [  # (DirEntry's: no Path made a file)
                Path(e.path) for e in found if is_rows(e.path, regular=True)]
            if rows is not None:
                rows += found_rows
            if any(e.name.endswith((".json", ".json.gz")) for e in entries
                   if e.path not in dumps) or not (inside or found_rows or dumps):
                traces.append(argument)
        elif path.suffix == ".jsonl":
            if not path.exists():
                raise FileNotFoundError(argument)
            records.append(path)
        elif rows is not None and is_rows_name(path):
            if not path.exists():
                raise FileNotFoundError(argument)
            rows.append(path)
        elif rows is not None and (ring_files.is_ring(path) or flight_recorder.is_dump(path)):
            rows.append(path)
        else:
            traces.append(argument)
    return traces, records


def cross_rank(arguments: list[str],
               say: Callable[[str], None] = _silent) -> tuple[list[Path], list[Path], list[Path]]:
    """A cross-rank command's traces, record files and rows files. A folder's trace whose rows
    lie beside it (``NAME.rows``, written in the job) is read through its rows: said once."""
    rows: list[Path] = []
    named, records = split(arguments, rows, say)
    skipped: list[str] = []
    traces = paths.expand(named, skip_outputs=False, skipped=skipped) if named else []
    for note in skipped:
        say(note)
    beside = {t: rows_beside(t) for t in traces}
    have_rows = {os.path.realpath(p) for p in rows} if any(beside.values()) else set()
    for found in beside.values():  # a trace named as a file: its rows, as a folder's
        if found is not None and os.path.realpath(found) not in have_rows:
            rows.append(found)
            have_rows.add(os.path.realpath(found))
    through_rows = [t for t, found in beside.items() if found is not None]
    if through_rows:
        many = len(through_rows)
        say(f"{many} trace{'' if many == 1 else 's'} read through the rows written "
             f"beside them in the job ({', '.join(p.name for p in through_rows[:3])}"
             f"{', ...' if len(through_rows) > 3 else ''})")
        traces = [t for t in traces if t not in through_rows]
        # their record files were joined into the rows too
        ranks_rows = {t.name.split(".")[0] for t in through_rows}
        records = [r for r in records if r.stem not in ranks_rows]
    return traces, records, rows


def every_file(arguments: list[str]) -> list[Path]:
    """Every file named, and every file in a folder named that autoannot did not write there
    as another command's output (what a command may read)."""
    found = []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            own = outputs.listed_outputs(path)
            with os.scandir(path) as listing:
                found += [Path(e.path) for e in listing if not e.is_dir()
                          and own.get(e.name) in (None, "annotate")]
        else:
            found.append(path)
    return found


def to_check(arguments: list[str]) -> list[Path]:
    """What ``check`` compares of the files and folders named: a folder's ledgers, record
    files, rows and Flight Recorder dumps, or else its traces. TraceError for a folder with
    none, a path that is not there, or a file given twice."""
    from autoannot.traces import files
    from autoannot.traces.read import ledger

    found: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            here = sorted(p for p in path.iterdir() if p.is_file() and (
                p.name.endswith((ledger.SUFFIX, ledger.LEGACY_SUFFIX, *ROWS_SUFFIXES))
                or p.suffix == ".jsonl" or ring_files.is_ring(p) or flight_recorder.is_dump(p)))
            if not here:
                try:
                    here = paths.expand([argument], skip_outputs=False)
                except files.TraceError:
                    raise files.TraceError(f"{argument}: a folder with no ledger (*.autoannot), "
                                           "record file (*.jsonl) or trace") from None
            found += here
        elif not path.exists():
            raise files.TraceError(f"{argument}: no such file or folder")
        else:
            found.append(path)
    seen: dict[str, Path] = {}
    for path in found:
        key = os.path.realpath(path)
        if key in seen:
            raise files.TraceError(f"{path}: given twice (also as {seen[key]})")
        seen[key] = path
    return found

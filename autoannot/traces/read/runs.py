"""Runs of a job: every ``AUTOANNOT_RECORD`` line names the run of the job it came from
(``journal.run_identity``), and so does every rows file made in the job; files a job appended to
twice hold two. One rule for every command: the runs of all its inputs together (record files
and rows alike) are one run, or ``--run`` picks one; never is one run's launch lined up against
another's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoannot.traces.files import TraceError

#: The run of lines written before runs were recorded (one per file, as they were read then).
NO_RUN = "(no run recorded)"


def run_of(entry: dict[str, Any]) -> str:
    return str(entry.get("run") or NO_RUN)


def choose(found: dict[str, list[Path]], wanted: str | None) -> str | None:
    """The one run to line up, of ``found`` (run -> the record and rows files that hold it):
    ``wanted`` (``--run``), or the only one; TraceError naming every run and its files
    otherwise."""
    def listing() -> str:
        return "; ".join(f"{run!r} ({_names(paths)})" for run, paths in sorted(found.items()))

    if wanted is not None:
        if wanted not in found:
            raise TraceError(f"--run {wanted}: in none of these record or rows files"
                             + (f" (they hold {listing()})" if found else ""))
        return wanted
    if len(found) <= 1:
        return next(iter(found), None)
    raise TraceError(f"these inputs hold {len(found)} runs of a job — {listing()}: one "
                     "run's launches are never lined up against another's; give --run RUN")


def _names(paths: list[Path]) -> str:
    """The files' names, each once, the first six and a count of the rest."""
    names = list(dict.fromkeys(p.name for p in paths))
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


"""Runs in record files: every ``AUTOANNOT_RECORD`` line names the run of the job it came from
(``journal.run_identity``); files a job appended to twice hold two. The tools read each run
apart and never line up one run's launches against another's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoannot.traces.files import TraceError

#: The run of lines written before runs were recorded (one per file, as they were read then).
NO_RUN = "(no run recorded)"


def run_of(entry: dict[str, Any]) -> str:
    return str(entry.get("run") or NO_RUN)


def choose(found: dict[str, list[Path]], wanted: str | None) -> str | None:
    """The one run to line up, of ``found`` (run -> the record files that hold it): ``wanted``
    (``--run``), or the only one; TraceError naming every run and its files otherwise."""
    def listing() -> str:
        return "; ".join(f"{run!r} ({', '.join(p.name for p in paths)})"
                         for run, paths in sorted(found.items()))

    if wanted is not None:
        if wanted not in found:
            raise TraceError(f"--run {wanted}: in none of these record files (they hold "
                             f"{listing()})")
        return wanted
    if len(found) <= 1:
        return next(iter(found), None)
    raise TraceError(f"these record files hold {len(found)} runs of a job — {listing()}: one "
                     "run's launches are never lined up against another's; give --run RUN")

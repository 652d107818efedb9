"""Where the rings are kept when the watch is asked for without ``AUTOANNOT_RING``
(``AUTOANNOT_WATCH=1`` alone): a folder of each run of the job under the system's temporary
folder, ``{tmp}/autoannot-{user}/runs/{run}`` (the run: what every rank of one run agrees
on, ``keep.journal.run_identity``), which every rank of the host sees and ``autoannot watch``
finds with no folder given (the newest run's).

Old runs' folders do not pile up: when a run's folder is made, the runs beyond the newest
``KEEP_RUNS`` (by when a ring of each was last opened, or named a launch of a new kind) are
removed, but for one whose ranks' processes still run on this host. The user's folder is made
for that user alone (mode 0700) and never used where another user owns it.

Imports nothing but the standard library (the runtime and the tools both use it)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile

#: Runs whose folders are kept (the newest; older ones go when a new run's folder is made).
KEEP_RUNS = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def root() -> str:
    """The folder of the runs' folders: ``{tmp}/autoannot-{user}/runs``, where ``{tmp}`` is
    the system's temporary folder as ``tempfile`` finds it (``TMPDIR``, ``TEMP``, ``TMP``,
    else the platform's), read anew at each call."""
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    tmp = next((os.environ[name] for name in ("TMPDIR", "TEMP", "TMP")
                if os.environ.get(name)), None) or tempfile.gettempdir()
    return os.path.join(tmp, f"autoannot-{user}", "runs")


def folder_of(run: str) -> str:
    """The folder of the run ``run``'s rings (its name made safe for a path)."""
    return os.path.join(root(), _UNSAFE.sub("_", run).strip("._") or "run")


def make(run: str) -> tuple[str, bool]:
    """The folder of ``run``'s rings, made if need be; whether this call made it (then the
    old runs' folders are cleared: ``prune``). OSError where it cannot be used (the user's
    folder owned by another user: a ring there could be read or replaced by them)."""
    base = root()
    mine = os.path.dirname(base)
    with contextlib.suppress(FileExistsError):
        os.mkdir(mine, 0o700)
    if hasattr(os, "getuid") and os.stat(mine).st_uid != os.getuid():
        raise PermissionError(f"{mine} belongs to another user")
    os.makedirs(base, mode=0o700, exist_ok=True)
    folder = folder_of(run)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        return folder, False
    prune(keep=folder)
    return folder, True


def runs() -> list[str]:
    """The runs' folders, newest first (by when a ring in each was last opened)."""
    base = root()
    try:
        with os.scandir(base) as listing:
            found = [entry.path for entry in listing if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    return sorted(found, key=_opened_at, reverse=True)


def newest() -> str | None:
    """The newest run's folder (None: no run's rings here)."""
    found = runs()
    return found[0] if found else None


def prune(keep: str | None = None) -> list[str]:
    """Remove the runs' folders beyond the newest ``KEEP_RUNS`` (never ``keep``, nor one a
    process of which still runs on this host); the folders removed."""
    removed = []
    for folder in runs()[KEEP_RUNS:]:
        if folder == keep or _alive(folder):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _opened_at(folder: str) -> float:
    """When a ring of ``folder`` was last opened (its names file, made at the opening and
    written only when a new kind or call site is seen), else when the folder was made."""
    times = [os.stat(folder).st_mtime] if os.path.isdir(folder) else [0.0]
    try:
        with os.scandir(folder) as listing:
            times += [entry.stat().st_mtime for entry in listing
                      if entry.name.endswith(".ring.names")]
    except OSError:
        pass
    return max(times)


def _alive(folder: str) -> bool:
    """Whether a process that opened a ring of ``folder`` still runs on this host (a process
    of another host, or one whose names cannot be read, counts as gone)."""
    import socket

    host = socket.gethostname()
    try:
        with os.scandir(folder) as listing:
            names = [entry.path for entry in listing if entry.name.endswith(".ring.names")]
    except OSError:
        return False
    for path in names:
        try:
            with open(path, "rb") as f:
                first = json.loads(f.readline())
            pid = int(first["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if first.get("host") != host:
            continue
        try:
            os.kill(pid, 0)  # (PermissionError: alive, another user's)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        return True
    return False

"""The ledger: what each CUDA graph a process captured launches, written next to its trace.

For a trace exported to ``DIR/NAME.json`` (or ``.json.gz``) the agent writes
``DIR/NAME.autoannot``: the ledger of every graph the process captured with the agent on (graph
name -> collectives in capture order) and, where torch's toolsId path ran, torch's kernel
annotations (toolsId -> annotations). Its name ends in neither ``.json`` nor ``.gz``, so no
folder loader takes it for a trace (HolisticTraceAnalysis loads every ``*.json``/``*.gz`` of
a folder as a rank's trace; TensorBoard's plugin every ``*.pt.trace.json``). Ledgers written
by earlier versions (``NAME.autoannot.json``) are still read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from autoannot.traces.files import TraceError, atomic_write_text
from autoannot.traces.names import GRAPH_PREFIX, REPLAY_PREFIX, trace_stem

__all__ = ["FORMAT", "GRAPH_PREFIX", "REPLAY_PREFIX", "SUFFIX", "find", "ledger_path", "load",
           "write"]

FORMAT = "autoannot-ledger"
VERSION = 1
SUFFIX = ".autoannot"
LEGACY_SUFFIX = ".autoannot.json"  # before 0.2: a name HTA took for a rank's trace


def ledger_path(trace_path: str | os.PathLike[str]) -> str:
    """``run/trace.json(.gz)`` -> ``run/trace.autoannot``."""
    return trace_stem(trace_path) + SUFFIX


def find(trace_path: str | os.PathLike[str]) -> Path | None:
    """The ledger next to a trace: this version's name, else an earlier version's."""
    for suffix in (SUFFIX, LEGACY_SUFFIX):
        candidate = Path(trace_stem(trace_path) + suffix)
        if candidate.is_file():
            return candidate
    return None


def load(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TraceError(f"{path}: no such ledger file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: not a readable autoannot ledger ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise TraceError(f"{path}: not an autoannot ledger (no \"format\": \"{FORMAT}\")")
    version = document.get("version", VERSION)
    if version != VERSION:
        raise TraceError(f"{path}: a ledger of version {version!r}; this autoannot reads "
                         f"version {VERSION} (a newer autoannot wrote it?)")
    return document


def write(trace_path: str | os.PathLike[str], document: dict[str, Any]) -> str:
    """Write a ledger document next to a trace (atomically); returns its path."""
    path = ledger_path(trace_path)
    atomic_write_text(path, json.dumps({"format": FORMAT, "version": VERSION, **document},
                                       default=str))
    return path

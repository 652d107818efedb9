"""The names the agent gives graphs and replays in traces, and the files it writes beside a
trace: the runtime writes them, the trace tools read them (kept apart so the runtime imports
nothing else of the trace tools)."""

import os
from itertools import pairwise

#: A replay of graph G runs inside ``record_function(REPLAY_PREFIX + G)`` while profiling.
REPLAY_PREFIX = "autoannot.replay:"
#: Graphs are named GRAPH_PREFIX + a number, per process.
GRAPH_PREFIX = "autoannot.graph."


def trace_stem(trace_path: "str | os.PathLike[str]") -> str:
    """``run/trace.json(.gz)`` -> ``run/trace``: what the files beside a trace are named after
    (its ledger ``run/trace.autoannot``, its rows ``run/trace.rows.parquet``)."""
    path = os.fspath(trace_path)
    for ending in (".gz", ".json"):
        path = path.removesuffix(ending)
    return path


#: What torch records as the description of a group created without one.
NO_DESCRIPTION = ("", "undefined")
#: Groups of more ranks than this are written short (first-last/stride).
LISTED_RANKS = 8


def ranks_text(ranks: "tuple[int, ...] | list[int]") -> str:
    """A group's ranks as a reader names them: ``[0, 2]``; a large group short, evenly spaced
    as first-last/stride (``[0-1023]``, ``[0-62/2]``), otherwise its first and last ranks and
    its size (``[0, 1, 5, ..., 1021] (40 ranks)``)."""
    ranks = list(ranks)
    if len(ranks) <= LISTED_RANKS:
        return "[" + ", ".join(map(str, ranks)) + "]"
    stride = ranks[1] - ranks[0]
    if stride > 0 and all(b - a == stride for a, b in pairwise(ranks)):
        return f"[{ranks[0]}-{ranks[-1]}" + (f"/{stride}]" if stride > 1 else "]")
    return f"[{', '.join(map(str, ranks[:3]))}, ..., {ranks[-1]}] ({len(ranks)} ranks)"


def group_desc(desc: "str | None", ranks: "tuple[int, ...] | list[int] | None") -> str:
    """What a group is called: torch's description; where it has none (a group made without
    ``group_desc``, which torch records as ``undefined``), its ranks (``ranks_text``); "" where
    neither is known."""
    if desc and desc not in NO_DESCRIPTION:
        return desc
    return ranks_text(ranks) if ranks else ""


def group_label(name: str, desc: "str | None", ranks: "tuple[int, ...] | list[int] | None" = None
                ) -> str:
    """A group named in a sentence (after the word "group"): ``1 (tp)``; without a
    description, ``3 [0, 2]`` (``group_desc``); ``3`` where nothing more is known."""
    called = group_desc(desc, ranks)
    if not called:
        return name
    return f"{name} {called}" if called.startswith("[") else f"{name} ({called})"


def group_column(name: str, desc: "str | None",
                 ranks: "tuple[int, ...] | list[int] | None" = None) -> str:
    """A group in a table's column: ``tp (1)``, ``[0, 2] (3)`` (``group_desc``), ``? (3)``
    where nothing more than its name is known."""
    return f"{group_desc(desc, ranks) or '?'} ({name})"

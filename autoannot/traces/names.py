"""The names the agent gives graphs and replays in traces, and the files it writes beside a
trace: the runtime writes them, the trace tools read them (kept apart so the runtime imports
nothing else of the trace tools)."""

import os

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

"""The names the agent gives graphs and replays in traces: the runtime writes them, the trace
tools read them (kept apart so the runtime imports nothing else of the trace tools)."""

#: A replay of graph G runs inside ``record_function(REPLAY_PREFIX + G)`` while profiling.
REPLAY_PREFIX = "autoannot.replay:"
#: Graphs are named GRAPH_PREFIX + a number, per process.
GRAPH_PREFIX = "autoannot.graph."

"""The trace tools: merge the agent's annotations into Kineto traces (``annotate``), write them
as JSON, gzip or Perfetto (``files``, ``perfetto``), and read what they say (``summary``,
``plot``).

A subsystem beside the runtime agent: it reads and writes files only, and imports neither torch
nor the agent's runtime modules. The agent imports from here what both sides share: the ledger
format and the names it gives graphs and replays (``ledger``), atomic writes (``files``).
"""

"""Where launches go once seen: the launch event and its one sink, ``record()``'s records, the
record file (journal), the always-on ring, the capture ledgers and the capture check. Imports
nothing of the trace tools but their shared words (``traces.names``, ``traces.read.ledger``'s
format)."""

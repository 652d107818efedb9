"""Where launches go once seen: the launch event and its one sink, ``record()``'s records, the
record file (journal), the capture ledgers, the files written beside an exported trace, and the
capture check."""

"""What reads a job's own files while it runs: the watch (rank 0's thread, ``watch_thread``, and
``autoannot watch``: ``watch``), its Prometheus metrics (``metrics``) and the tally they count
by (``tally``), each rank's progress published to a store (``publish``, documents: ``progress``),
and the trace a rank just exported, annotated and its rows written (``export``). A wing of its
own above the trace tools' readers and analysis, which it uses; the runtime (``keep/``) knows it
only as the start-up hook and the agent start it."""

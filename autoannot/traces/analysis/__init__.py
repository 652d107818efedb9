"""The analysis: every rank's launches matched into instances across ranks (``matching``, the
one matcher), from a job's files (``lineup``); the ranks' sequences compared (``sequences``)."""

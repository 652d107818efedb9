"""Readers: what a job wrote — traces (``annotate`` through a rank's ledger), ledgers, record
files, runs — read into each rank's launches (``rank_files``)."""

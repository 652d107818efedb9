"""Renderers: the analysis as the user reads it — ``skew``'s text, JSON and CSV, the page
(``report``), per-group tables (``summary``), the timeline picture (``plot``)."""

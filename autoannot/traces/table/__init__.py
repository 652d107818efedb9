"""The table: one rank's launches (``launch``), and its rows as columns and as files any tool
reads (``rows``: Parquet, or autoannot's own columns)."""

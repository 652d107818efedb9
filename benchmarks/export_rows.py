"""What writing a rank's rows at export adds on a large trace, the way ef300d4 did it and the
way it is done now — each timed, on one generated trace (``benchmarks/trace_tool.py``'s:
replays of two CUDA graphs among CPU operator events, and its ledger):

- before (to ef300d4): annotate the trace into a temporary file through its ledger, read that
  back and make the rows (``annotate_file`` + ``rows_of_trace`` of the temporary);
- now (``export.Exported``): read the trace once, annotate it in memory, make the rows from
  what is in memory.

Then the rows are written (Parquet, or autoannot's own columns).

    python benchmarks/export_rows.py [--events N]

Prints one line of JSON. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> int:
    import trace_tool

    from autoannot.live import export
    from autoannot.traces.read import annotate, rank_files
    from autoannot.traces.table import rows

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace, _, _ = trace_tool.generate(Path(tmp), args.events)
        figures: dict[str, object] = {"events": args.events,
                                      "trace_mib": round(trace.stat().st_size / 2**20)}
        started = time.perf_counter()
        readable = Path(tmp) / "scratch" / trace.name
        readable.parent.mkdir()
        annotate.annotate_file(trace, readable)
        before = rank_files.rows_of_trace(readable)
        figures["before_s"] = round(time.perf_counter() - started, 2)
        started = time.perf_counter()
        exported = export.Exported(str(trace))
        made = rank_files.rows_of_trace(trace, scanned=(exported.trace, exported.scan,
                                                  exported.patches))
        figures["now_s"] = round(time.perf_counter() - started, 2)
        figures["rows"] = len(made)
        figures["same_rows"] = {k: list(v) for k, v in made.columns.items()} == {
            k: list(v) for k, v in before.columns.items()}
        for name, write, path in (("parquet", rows.write_parquet, "t.rows.parquet"),
                                  ("binary", rows.write, "t.rows")):
            started = time.perf_counter()
            write(made, Path(tmp) / path)
            figures[f"write_{name}_s"] = round(time.perf_counter() - started, 3)
            figures[f"{name}_kib"] = round((Path(tmp) / path).stat().st_size / 1024)
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

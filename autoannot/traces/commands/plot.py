"""``autoannot plot TRACE|DIR... -o PNG``: a timeline, one band per rank, a lane per group."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from autoannot.traces.commands.common import DONE, INCOMPLETE, bad_input, check_written, say


def run(args: argparse.Namespace) -> int:
    from autoannot.traces import files, paths

    output = Path(args.output)
    if output.suffix not in (".png", ".svg", ".pdf"):
        return bad_input("plot", f"-o {output}: name it .png, .svg or .pdf")
    try:
        skipped: list[str] = []
        traces = paths.expand(args.traces, skip_outputs=False, skipped=skipped)
        check_written(traces, [output], args.force)
        for note in skipped:
            say("plot", note)
    except files.TraceError as exc:
        return bad_input("plot", str(exc))
    from autoannot.traces import outputs as written
    from autoannot.traces.render import plot  # matplotlib itself is imported when drawing

    drawn: dict[str, Any] = {}
    try:
        written.write_all({output: lambda tmp: drawn.update(plot.plot(traces, tmp, args.title,
                                                                      output.suffix))},
                          "plot")
    except ImportError:
        return bad_input("plot", "needs matplotlib: pip install matplotlib")
    except plot.NothingToDraw as exc:
        say("plot", str(exc))
        return INCOMPLETE
    except files.TraceError as exc:
        return bad_input("plot", str(exc))
    except OSError as exc:
        return bad_input("plot", f"{output}: cannot write: {exc.strerror}")
    if args.json:
        print(json.dumps({"output": str(output), **drawn}, indent=1))
    else:
        print(f"{output}: {drawn['ranks']} ranks, {drawn['lanes']} lanes, {drawn['kernels']} "
              "kernels")
    return DONE

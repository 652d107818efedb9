"""``autoannot report ROWS|TRACE|DIR|RECORDS... -o HTML``: the whole job on one page."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autoannot.traces.commands.common import DONE, INCOMPLETE, bad_input, write_outputs
from autoannot.traces.commands.lined_up import analysis_of


def run(args: argparse.Namespace) -> int:
    from autoannot.traces import files
    from autoannot.traces.render import skew

    output = Path(args.output)
    if output.suffix not in (".html", ".htm"):
        return bad_input("report", f"-o {output}: name it .html")
    try:
        import numpy  # noqa: F401
        import plotly  # noqa: F401
    except ImportError as exc:
        return bad_input("report", f"needs numpy and plotly ({exc.name} is missing): pip "
                         "install 'autoannot[report]'")
    analysis, inputs = analysis_of("report", args, [output])
    if isinstance(analysis, int):
        return analysis
    if args.instance is not None and not 0 <= args.instance < len(analysis.instances):
        return bad_input("report", f"--instance {args.instance}: there are "
                         f"{len(analysis.instances)} instances (0-{len(analysis.instances) - 1})")
    from autoannot.traces.render import report

    names = [str(p) for p in inputs]
    failed = write_outputs("report", {output: lambda tmp: files.atomic_write_text(
        str(tmp), report.render(analysis, names, args.title, args.instance))})
    if failed is not None:
        return failed
    lead = skew.lead(analysis)
    if args.json:
        print(json.dumps({"output": str(output), "instances": len(analysis.instances),
                          "ranks": analysis.per_rank(), "lead": lead, "hang": analysis.hang,
                          "missing": analysis.missing, "origins": analysis.origins(),
                          "problems": analysis.problems, "notes": analysis.notes}, indent=1))
    else:
        print(f"{output}: {len(analysis.instances)} instances on {len(analysis.ranks)} ranks; "
              f"{len(analysis.problems)} not matched")
        for line in lead:
            print(f"  {line}")
    return (INCOMPLETE if analysis.problems or analysis.missing or not analysis.instances
            else DONE)

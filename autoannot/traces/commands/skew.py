"""``autoannot skew ROWS|TRACE|DIR|RECORDS... [-o FILE]``: each collective lined up across its
ranks, and where each delay began."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autoannot.traces.commands.common import (
    DONE,
    INCOMPLETE,
    bad_input,
    not_json_or_csv,
    say,
    write_outputs,
)
from autoannot.traces.commands.lined_up import analysis_of


def run(args: argparse.Namespace) -> int:
    from autoannot.traces.render import skew

    outputs = [Path(o) for o in args.output or []]
    wrong = not_json_or_csv(outputs)
    if wrong:
        return bad_input("skew", wrong)
    analysis, _ = analysis_of("skew", args, outputs)
    if isinstance(analysis, int):
        return analysis
    failed = write_outputs("skew", {out: (lambda tmp, write=(
        skew.write_csv if out.suffix == ".csv" else skew.write_json): write(analysis, tmp))
        for out in outputs})
    if failed is not None:
        return failed
    if args.json:  # (after the files: a reader that leaves early loses none of them)
        print(json.dumps({"lead": skew.lead(analysis), "hang": analysis.hang,
                          "missing": analysis.missing, "origins": analysis.origins(args.top),
                          "instances": analysis.rows(), "ranks": analysis.per_rank(),
                          "clocks": [c.__dict__ for c in analysis.clocks],
                          "problems": analysis.problems, "notes": analysis.notes}, indent=1))
    else:
        print(skew.format_report(analysis, args.top))
    if not analysis.instances:
        say("skew", "no collective instance across ranks in these inputs")
        return INCOMPLETE
    if analysis.missing:
        from autoannot.traces.analysis.matching import count

        say("skew", f"ranks are missing from {count(len(analysis.missing), 'group')} (named "
            "above)")
        return INCOMPLETE
    return INCOMPLETE if analysis.problems else DONE

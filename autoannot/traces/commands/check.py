"""``autoannot check LEDGER|RECORDS|ROWS|TRACE|DIR...``: do the ranks launch the same
collectives in the same order?"""

from __future__ import annotations

import argparse
import json

from autoannot.traces.commands.common import DONE, INCOMPLETE, bad_input, say


def run(args: argparse.Namespace) -> int:
    from autoannot.traces import files
    from autoannot.traces.analysis import sequences
    from autoannot.traces.read import inputs as input_files

    try:
        inputs = input_files.to_check(args.inputs)
        missing: list[str] = []
        hang_lead: list[str] = []
        divergences, compared, ranks = sequences.check_files(inputs, args.run, missing,
                                                             hang_lead)
    except files.TraceError as exc:
        return bad_input("check", str(exc))
    if args.json:
        print(json.dumps({"ranks": ranks, "sequences_compared": compared, "hang": hang_lead,
                          "missing": missing,
                          "divergences": [d.as_dict() for d in divergences]}, indent=1))
    else:
        from autoannot.traces.analysis.matching import count

        for line in hang_lead:
            print(line)
        for line in missing:
            print(f"MISSING: {line}")
        for divergence in divergences:
            print(f"DIVERGES: {divergence.describe()}")
        print(f"{compared} sequences (graph or eager, per process group) compared across "
              f"{ranks} ranks: {len(divergences)} diverge"
              + (f"; ranks missing from {count(len(missing), 'group')}" if missing else ""))
    if not compared:
        say("check", "nothing to compare: give two ranks' ledgers, record files or traces")
        return INCOMPLETE
    return INCOMPLETE if divergences or missing or hang_lead else DONE

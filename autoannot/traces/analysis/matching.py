"""The one analysis: every rank's launches matched into collective instances across ranks, and
what each instance says — who arrived last, how long each rank waited, what the transfer took,
where a delay began — in whole-array steps (numpy), with no object per launch or instance.

An *instance* is one collective on the member ranks of its process group: the same group, the
same position in that group's sequence. Rules: every rank present agrees on the collective and
its size (else the instance is left out, named); an instance some member ranks left no record
of is lined up on the ranks present, and the missing ranks are named per group (``missing``);
clocks are fitted on GPU kernels' ends only.

Scale: every reader (traces, record files, rows) gives launches in one table (``rows.Rows``,
a column each); the matcher (``partitions``, its passes ``passes``) cuts the job into
partitions of a few million launches, each matched whole-array (numpy), run one at a time,
on this machine's cores or on a Dask cluster (``engines``): memory is one partition's, not
the job's. This module is the entry; ``results`` holds what it finds.
"""

from __future__ import annotations

from typing import Any

from autoannot.traces.analysis.results import (  # noqa: F401  (the analysis's names, here too)
    IN_STEP_US,
    LISTED_PROBLEMS,
    Analysis,
    ClockFit,
    Figures,
    Instance,
    count,
    describe_missing,
    disagreement,
    far_clocks_note,
    natural_key,
    rank_list,
)
from autoannot.traces.table.rows import Rows


def analyze_rows(ranks_rows: list[Rows], include_warmup: bool = False, engine: Any = None,
                 target: int | None = None) -> Analysis:
    """Instances, clocks and per-instance and per-rank figures of every rank's rows (in
    memory, or heads of rows files read by row range: ``rows.read_head``), in partitions of
    about ``target`` launches run by ``engine`` (default: this process)."""
    from autoannot.traces.analysis import engines, passes

    plan = passes.plan_of(ranks_rows)
    return passes.run(plan, engine or engines.Embedded(jobs=1), include_warmup, target)

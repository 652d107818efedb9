"""Differential fuzzing on a real gloo group: the agent changes no result, no exception.

CI runs a small budget; the full run is

    AUTOANNOT_FUZZ_EXAMPLES=10000 python -m pytest tests/test_fuzz.py -q
"""

from __future__ import annotations

import os

import fuzz_calls
from harness import run_ranks


def test_generated_calls_behave_the_same_with_the_agent(figures) -> None:
    budget = os.environ.get("AUTOANNOT_FUZZ_EXAMPLES")  # set: a new random run of that size
    examples = int(budget or 400)
    (stats,) = run_ranks(fuzz_calls.fuzz, 1, "gloo", (examples, budget is None),
                         timeout_s=20)  # a generated call that would hang raises instead
    figures["fuzzed calls (agent off / fast path / annotating)"] = (
        f"{stats['calls']} calls, {stats['raised']} raising, "
        f"{stats['nondeterministic']} nondeterministic in torch itself, "
        f"{len(stats['differences'])} differences"
        + (f"; not fuzzed (torch's gloo aborts on them): {', '.join(stats['constrained'])}"
           if stats["constrained"] else ""))
    assert stats["calls"] >= min(examples, 100)
    assert stats["differences"] == [], stats["differences"][:3]


def test_generated_calls_behave_the_same_with_warnings_as_errors(figures) -> None:
    """The same, with every call under warnings-as-errors (``-W error``): the agent's own
    diagnostics never surface as an exception, so nothing differs."""
    (stats,) = run_ranks(fuzz_calls.fuzz, 1, "gloo", (200, True, "error"), timeout_s=20)
    figures["fuzzed calls with warnings as errors (off / fast path / annotating)"] = (
        f"{stats['calls']} calls, {stats['raised']} raising, "
        f"{len(stats['differences'])} differences")
    assert stats["calls"] >= 100
    assert stats["differences"] == [], stats["differences"][:3]

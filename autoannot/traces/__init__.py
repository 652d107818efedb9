"""The trace tools, a subsystem beside the runtime agent: they read and write files only, and
import neither torch nor the agent's runtime modules. Data flows one way through its folders:

* ``read/``: what a job wrote (traces, ledgers, record files) read into launches;
* ``table/``: the launches as one table, and the rows files any tool queries;
* ``analysis/``: instances across ranks, and who held whom up;
* ``render/``: text, JSON, CSV, the page, the picture.

Beneath them the files' own mechanics, which every layer uses: ``files`` (Kineto's JSON,
streamed; atomic writes), ``perfetto`` (the ``.pftrace`` format), ``paths`` and ``outputs``
(what a command reads, and what it may write over), ``units``, ``names``, ``parallel``.
The agent imports from here what both sides share: the ledger format (``read.ledger``), the
names it gives graphs and replays (``names``), atomic writes (``files``), and the comparison of
the ranks' collective sequences (``first_divergence``, below), never the analysis itself.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def first_divergence(scope: str, by_rank: dict[int, list[tuple[str, dict[str, Any], Any]]]
                     ) -> str | None:
    """Where the ranks' launches of one scope (a captured graph) first differ, as ``autoannot
    check`` says it; None where they agree. ``by_rank``: each rank's launches, as (group,
    annotation, call site)."""
    from autoannot.traces.analysis import sequences

    return sequences.first_divergence(scope, by_rank)

"""``AUTOANNOT_VERIFY=1``: at the end of each capture, the ranks compare the collectives they
captured into the graph, through the default group's c10d store (no collective on any stream),
before a replay can hang. The comparison is the trace tools' (``autoannot check``'s)."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

from autoannot import traces
from autoannot.describe import vocabulary as V


class SequenceMismatch(RuntimeError):
    """The ranks captured different collective sequences into one graph: replaying it would
    hang or corrupt."""


def verify_capture(graph_name: str, entries: list[dict[str, Any]], timeout_s: float = 300.0
                   ) -> None:
    """Compare a just-captured graph's collectives (its ledger's entries) with the other
    ranks'. Every rank posts its sequence to the store and waits for those of the ranks its
    graph's collectives involve; raises ``SequenceMismatch`` naming the first divergence, on
    every rank that sees it."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return
    me = dist.get_rank()
    members = _members(entries, dist) | {me}
    if len(members) < 2:
        return
    store = dist.distributed_c10d._get_default_store()
    mine = [[entry.get("annotation", {}).get(V.PG_NAME), entry.get("annotation", {}),
             entry.get("call_site")] for entry in entries]
    prefix = f"autoannot/verify/{graph_name}/"
    store.set(prefix + str(me), json.dumps(mine))
    keys = [prefix + str(rank) for rank in sorted(members)]
    store.wait(keys, timedelta(seconds=timeout_s))
    by_rank = {rank: [tuple(posted) for posted in json.loads(store.get(prefix + str(rank)))]
               for rank in sorted(members)}
    first = traces.first_divergence(graph_name, by_rank)
    if first is not None:
        raise SequenceMismatch(
            "autoannot (AUTOANNOT_VERIFY): the ranks captured different collectives into "
            f"this CUDA graph; replaying it would hang or corrupt. First difference: {first}")


def _members(entries: list[dict[str, Any]], dist: Any) -> set[int]:
    """The global ranks of the groups a graph's collectives run on."""
    names = {str(e.get("annotation", {}).get(V.PG_NAME)) for e in entries}
    ranks: set[int] = set()
    c10d = dist.distributed_c10d
    for group, name in c10d._world.pg_names.items():
        if str(name) in names:
            ranks.update(c10d.get_process_group_ranks(group))
    return ranks

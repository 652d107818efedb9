"""A rank's progress, as it publishes it to the job's store for a watcher on another host
(``live.publish``): from its ring, per group, its last launches (what each was, its call site,
when it was entered) and the entry times and time outside collectives of its last
``publish.TAIL`` (the straggler windows). One small JSON document a rank; the watcher
turns the documents of all ranks into the steps the hang analysis and the straggler window
read (``watch.steps_of_documents``, ``tails_of``), as it does rings read whole.

A document: ``{"v": 1, "rank", "run", "host", "count", "published_ns", "base_us", "groups":
{group: {"size", "first" and "stride" or "ranks", "last": [[seq, what, call site, entered
wall ns], ...], "tail": [[seq, entered us after base_us, time outside us or -1], ...]}}}``,
about 1.5 KB for 3 groups; the publisher adds ``"totals": {group: {"launches": {collective:
n}, "seconds": s}}`` (``tally.Tally.totals``). Entry times of the tail are the rank's own
monotonic clock, its host's: the straggler window compares them between ranks of one host
only, and reads a group that spans hosts from the times outside collectives alone
(``analysis.stragglers``).
"""

from __future__ import annotations

import json
import math
from itertools import pairwise
from typing import Any, NamedTuple

from autoannot.traces import names
from autoannot.traces.read import ring_files

#: The version of the document.
VERSION = 1
#: Each group's last launches a document names (the hang analysis reads the last).
LAST = 2


def of_ring(one: ring_files.RingRead, tail: int, published_ns: int | None = None
            ) -> dict[str, Any]:
    """The progress document of a ring (its last ``tail`` launches per group in the straggler
    window; read with at least that many launches), published at ``published_ns`` (wall
    clock)."""
    from autoannot.describe.vocabulary import SEQUENCE_FIELDS
    from autoannot.traces.read.rank_files import group_ranks

    records = one.records
    wall = one.wall_ns(records["entered_ns"])
    base_us = int(records["entered_ns"][0] // 1000) if len(records) else 0
    entered_us = records["entered_ns"] // 1000 - base_us
    returned = records["returned_ns"]
    groups: dict[str, dict[str, Any]] = {}
    for i in range(len(records) - 1, -1, -1):
        kind = one.kinds.get(int(records["kind"][i]))
        if kind is None:
            continue
        annotation = kind["annotation"]
        group = groups.get(kind["group"])
        if group is None:
            group = groups[kind["group"]] = {
                "size": annotation.get("Group size"), **_members(group_ranks(annotation)),
                "desc": annotation.get("Process Group Description") or "",
                "last": [], "tail": []}
        seq = int(records["seq"][i])
        if len(group["last"]) < LAST:
            group["last"].append([seq, [annotation.get(k) for k in SEQUENCE_FIELDS],
                                  one.sites.get(int(records["site"][i])), int(wall[i])])
        if len(group["tail"]) < tail:
            before = returned[i - 1] if i > 0 else 0
            outside = (records["entered_ns"][i] - before) // 1000 if before > 0 else -1
            outside = outside if outside >= 0 else -1  # (a graph replay's launches: unknown)
            group["tail"].append([seq, int(entered_us[i]), int(outside)])
    return {"v": VERSION, "rank": one.rank, "run": one.meta.get("run"),
            "host": one.meta.get("host"), "count": one.count,
            "published_ns": published_ns, "base_us": base_us, "groups": groups}


def _members(ranks: tuple[int, ...] | None) -> dict[str, Any]:
    """A group's members as a document holds them: evenly spaced ones (the default group of
    65,536 ranks, a strided group) as their first and stride, others listed."""
    if not ranks:
        return {"ranks": None}
    stride = ranks[1] - ranks[0] if len(ranks) > 1 else 1
    if all(b - a == stride for a, b in pairwise(ranks)):
        return {"first": ranks[0], "stride": stride}
    return {"ranks": list(ranks)}


def members_of(held: dict[str, Any]) -> tuple[int, ...] | None:
    """A group's members from its document (``_members``)."""
    if "first" in held and isinstance(held.get("size"), int):
        return tuple(range(held["first"], held["first"] + held["stride"] * held["size"],
                           held["stride"]))
    return tuple(held["ranks"]) if held.get("ranks") else None


def encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, Any] | None:
    """A document, or None where the bytes are none of ours."""
    try:
        document = json.loads(data)
    except ValueError:
        return None
    return document if isinstance(document, dict) and document.get("v") == VERSION else None


def stale_culprit(documents: list[dict[str, Any]], culprit: int) -> str | None:
    """What to say where the culprit's progress was published before the others' last
    launches (a process stopped or gone publishes nothing after: its last launch may be later
    than it said); None where it was published after them."""
    mine = next((d for d in documents if int(d["rank"]) == culprit), None)
    if mine is None or not mine.get("published_ns"):
        return None
    latest = max((entry[3] for d in documents if int(d["rank"]) != culprit
                  for held in d["groups"].values() for entry in held["last"]), default=None)
    if latest is None or mine["published_ns"] >= latest:
        return None
    before_ms = (latest - mine["published_ns"]) / 1e6
    return (f"  (rank {culprit} last published its progress {before_ms:.0f} ms before the "
            "others' last launch, and nothing since: it stopped, or its host is "
            "gone; it may have launched after what it published — its ring, on its host, "
            "has its last launch)")


class Tails(NamedTuple):
    """The ranks' last launches as the straggler windows read them (``stragglers.Tracker``):
    entries and times outside collectives before each, group -> rank -> {seq: us}; the groups'
    members; each (group, rank)'s last call site; each rank's clock, its host (entries of
    different hosts are never compared); each group's label and what it is called
    (``names.group_label``, ``names.group_desc``)."""

    entered: dict[str, dict[int, dict[int, float]]]
    gaps: dict[str, dict[int, dict[int, float]]]
    members: dict[str, tuple[int, ...]]
    sites: dict[tuple[str, int], str]
    clocks: dict[int, str | None]
    labels: dict[str, tuple[str, str]]
    #: The groups read from the GPU's times (when each rank's GPU started each collective,
    #: on its host's clock), not the hosts' entries.
    gpu: set[str]


def tails_of(documents: list[dict[str, Any]]) -> Tails:
    """The straggler windows' inputs from the ranks' documents."""
    tails = Tails({}, {}, {}, {}, {}, {}, set())
    entered, gaps, members, sites, clocks, labels, _ = tails
    for document in documents:
        rank = int(document["rank"])
        clocks[rank] = document.get("host")
        base = int(document.get("base_us", 0))
        for group, held in document["groups"].items():
            ranks = members_of(held)
            if ranks:
                members.setdefault(group, ranks)
            if group not in labels or (held.get("desc") and ranks):
                desc = held.get("desc")
                labels[group] = (names.group_label(group, desc, ranks),
                                 names.group_desc(desc, ranks))
            mine = entered.setdefault(group, {}).setdefault(rank, {})
            outside = gaps.setdefault(group, {}).setdefault(rank, {})
            for seq, at_us, out_us in held["tail"]:
                mine[int(seq)] = float(base + at_us)
                outside[int(seq)] = math.nan if out_us < 0 else float(out_us)
            if held["last"] and held["last"][0][2]:
                sites[(group, rank)] = held["last"][0][2]
    return tails

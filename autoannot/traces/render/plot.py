"""``autoannot plot``: a timeline picture of communication and computation, one band per rank.

Each rank's band has a compute lane (every non-NCCL kernel) and one lane per process group
(its NCCL kernels, labelled with the collective and its size where there is room), so where
communication and computation overlap shows at a glance. Where the ranks' traces line up
(``skew.py``), each NCCL kernel is drawn in two parts: light while its rank waits for the last
one to arrive, solid while the transfer runs. Needs matplotlib.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from autoannot.describe import vocabulary as V
from autoannot.traces import files
from autoannot.traces.read.annotate import kernel_family
from autoannot.traces.render import summary
from autoannot.traces.units import size_text

_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
           "#8C8C8C"]
COMPUTE = "compute"


class NothingToDraw(files.TraceError):
    """Readable traces without a GPU kernel (CPU traces): says what they hold instead."""


def _lanes(path: Path) -> tuple[int | None, dict[str, list[tuple[float, float, str]]], int]:
    """A trace's rank, its kernels by lane, and its gloo collectives (CPU traces)."""
    trace = files.Trace(path)
    rank = trace.metadata().get("distributedInfo", {}).get("rank")
    events = (trace.document["traceEvents"] if trace.document is not None
              else (json.loads("{" + c + "}") for c in trace._chunks()
                    if '"kernel"' in c or '"gloo:' in c))
    lanes: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    gloo = 0
    for event in events:
        if not isinstance(event, dict):
            continue
        if event.get("cat") == "user_annotation" and str(event.get("name")).startswith("gloo:"):
            gloo += 1
        if event.get("cat") != "kernel":
            continue
        args = event.get("args", {})
        start, dur = float(event["ts"]), float(event.get("dur", 0))
        if kernel_family(event.get("name", "")):
            name = args.get(V.COLLECTIVE_NAME)
            if name is None:
                lanes["nccl (unannotated)"].append((start, dur, ""))
                continue
            nelems = max(int(args.get(V.IN_NELEMS, 0)), int(args.get(V.OUT_NELEMS, 0)))
            size = size_text(nelems * summary.DTYPE_BYTES.get(args.get(V.DTYPE), 0))
            name_of_group = str(args.get(V.PG_NAME, "?"))
            if len(name_of_group) > 10:  # mesh groups are named by a hash
                name_of_group = name_of_group[:8] + "…"
            group = f"{args.get(V.PG_DESC, '?')} (pg {name_of_group})"
            lanes[group].append((start, dur, f"{name} {size}"))
        else:
            lanes[COMPUTE].append((start, dur, ""))
    return rank, lanes, gloo


def _waits(paths: list[Path], ranks: list[int]) -> dict[tuple[int, float], float]:
    """(rank, kernel start in its trace's time) -> how long that kernel waited for the last
    rank, for the collectives the traces line up on; empty for one trace."""
    from autoannot.traces.analysis import lineup

    if len(paths) < 2:
        return {}
    try:
        analysis = lineup.analyze_files(paths, [])
    except files.TraceError:
        return {}
    offsets = {c.rank: c.offset_us for c in analysis.clocks if c.applied}
    waits = {}
    for row in analysis.rows():
        for rank, part in row["ranks"].items():
            start = part["start_us"] + offsets.get(int(rank), 0.0)  # back in the trace's time
            waits[(int(rank), round(start, 1))] = part["wait_us"]
    return waits


def plot(paths: list[Path], output: Path, title: str | None = None,
         kind: str | None = None) -> dict[str, Any]:
    """Draw the timeline; returns what was drawn (ranks, lanes, kernels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    read, gloo = [], 0
    for path in paths:
        rank, lanes, collectives = _lanes(path)
        read.append((path, rank if isinstance(rank, int) else None, lanes))
        gloo += collectives
    numbers = summary.assign_ranks([(path, rank) for path, rank, _ in read])
    ranks = [(number, lanes) for number, (_, _, lanes) in zip(numbers, read, strict=True)]
    ranks.sort(key=lambda item: item[0])
    starts = [s for _, lanes in ranks for lane in lanes.values() for s, _, _ in lane]
    if not starts:
        held = (f"CPU traces with {gloo} gloo collectives (gloo runs no GPU kernels): "
                "autoannot summary lists them" if gloo else "no collectives either")
        raise NothingToDraw(f"no GPU kernel to draw in {', '.join(map(str, paths))}: {held}")
    waits = _waits(paths, numbers)
    origin = min(starts)
    end = max(s + d for _, lanes in ranks for lane in lanes.values() for s, d, _ in lane)
    span = max(end - origin, 1e-3)
    groups = sorted({g for _, lanes in ranks for g in lanes if g != COMPUTE})
    colors = {g: _COLORS[i % len(_COLORS)] for i, g in enumerate(groups)}
    colors[COMPUTE] = "#B0B0B0"
    rows = [(rank, lane) for rank, lanes in ranks for lane in [COMPUTE, *groups]
            if lane in lanes]
    height = max(2.5, 0.45 * len(rows) + 1.2)
    fig, ax = plt.subplots(figsize=(14, height), dpi=110)
    labels, drawn = [], 0
    for y, (rank, lane) in enumerate(reversed(rows)):
        lanes = dict(ranks)[rank]
        bars = [((s - origin) / 1e3, max(d / 1e3, span / 1e3 / 2000)) for s, d, _ in lanes[lane]]
        waiting = [min(waits.get((rank, round(s, 1)), 0.0), d) for s, d, _ in lanes[lane]]
        moving = [(x + w / 1e3, max(width - w / 1e3, span / 1e3 / 2000))
                  for (x, width), w in zip(bars, waiting, strict=True)]
        ax.broken_barh([(x, w / 1e3) for (x, _), w in zip(bars, waiting, strict=True) if w],
                       (y - 0.35, 0.7), facecolors=colors[lane], alpha=0.3, edgecolor="none")
        ax.broken_barh(moving, (y - 0.35, 0.7), facecolors=colors[lane], edgecolor="none")
        for (_, _, text), (x, w) in zip(lanes[lane], bars, strict=True):
            if text and w > span / 1e3 * 0.04:  # label only where there is room
                ax.text(x + w / 2, y, text, ha="center", va="center", fontsize=7,
                        color="white", clip_on=True)
        drawn += len(bars)
        labels.append(f"rank {rank} · {lane}")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel("time (ms) since the first kernel")
    ax.set_xlim(0, span / 1e3 * 1.01)
    for boundary in range(1, len(ranks)):  # a line between rank bands
        per_rank = [sum(1 for r, _ in rows if r == rank) for rank, _ in ranks]
        ax.axhline(len(rows) - sum(per_rank[:boundary]) - 0.5, color="black", lw=0.6)
    ax.set_title(title or "communication lanes (one per process group) and compute, per rank"
                 + ("; light: waiting for the last rank, solid: the transfer" if waits else ""))
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format=(kind or output.suffix).lstrip(".") or "png")
    plt.close(fig)
    files.atomic_write_bytes(output, buffer.getvalue())
    return {"ranks": len(ranks), "lanes": len(rows), "kernels": drawn}

"""``autoannot report``: the whole job on one self-contained HTML page — who was late at which
collective and by how much (a rank x instance heat map), the stragglers ranked with their call
sites, each group's transfer time and bus bandwidth, whether the ranks agree, and the timeline
of one step.

Plotly draws it (``plotly``, with numpy): a well-kept library that writes static HTML with its
JavaScript inlined — the page opens from disk, with no server and no network — and that keeps
large matrices as typed arrays, so a heat map of thousands of ranks stays a few MB. Every figure
says what it can and cannot know: entry times (record files) have no transfer; gloo's CPU ranges
end apart; clocks of different hosts are fitted on GPU kernels only.
"""

from __future__ import annotations

import html
from typing import Any

from autoannot.traces import names
from autoannot.traces.analysis.matching import Analysis
from autoannot.traces.render.skew import us_text

#: Ranks drawn in the step's timeline (the straggler, the most delayed, then spread out).
TIMELINE_RANKS = 16


def stragglers(analysis: Analysis, top: int = 20) -> list[dict[str, Any]]:
    """The ranks others waited for most, each with its worst instance and call site there."""
    import numpy as np

    figures = analysis.figures()
    late = np.flatnonzero((figures.straggler >= 0)
                          & (~figures.warmup | analysis.warmup_counted))
    # each straggler's worst instance: the last of its instances by skew
    by_skew = late[np.argsort(figures.skew[late], kind="stable")]
    worst = np.full(len(analysis.ranks), -1, dtype=np.int64)
    worst[figures.straggler[by_skew]] = by_skew
    ranked = sorted((r for r in analysis.per_rank() if r["last_to_arrive"]),
                    key=lambda r: -r["others_waited_for_it_us"])[:top]
    column = {rank: c for c, rank in enumerate(analysis.ranks)}
    found = []
    for r in ranked:
        instance = analysis.instances[int(worst[column[r["rank"]]])]
        found.append({**r, "worst_skew_us": float(figures.skew[instance.index]),
                      "group": instance.group, "group_desc": instance.group_desc,
                      "seq": instance.seq, "collective": instance.collective,
                      "call_site": analysis.site(instance.index, column[r["rank"]])})
    return found


def group_rows(analysis: Analysis) -> list[dict[str, Any]]:
    """Per (group, collective, dtype, size), groups in natural order (tp2 before tp10):
    instances, median transfer and bus bandwidth (where the transfer is known: kernels and
    gloo's ranges, not entry times)."""
    import numpy as np

    from autoannot.traces.analysis.matching import natural_key
    from autoannot.traces.units import bus_factor

    f = analysis.figures()
    if not len(f.group):
        return []
    dtype = f.dtype if f.dtype is not None else np.zeros(len(f.group), np.int32)
    keys = (f.group, f.collective, dtype, f.size_bytes)
    order = np.lexsort(keys[::-1])  # (one sort: np.unique over rows of keys is far slower)
    changes = np.zeros(len(order), dtype=bool)
    changes[0] = True
    for key in keys:
        changes[1:] |= key[order][1:] != key[order][:-1]
    bounds = np.append(np.flatnonzero(changes), len(order))
    rows = []
    for k in range(len(bounds) - 1):
        mine = order[bounds[k]:bounds[k + 1]]
        group, collective, dtype_code, size = (int(key[mine[0]]) for key in keys)
        transfers = f.transfer[mine]
        transfers = transfers[~np.isnan(transfers) & (transfers > 0)]
        members = int(f.members[mine[0]])
        name = f.collective_names[collective]
        median = float(np.median(transfers)) if len(transfers) else None
        busbw = (size / (median * 1e-6) / 1e9 * bus_factor(name, members)
                 if median and size else None)
        rows.append({"group": f.group_names[group], "group_desc": f.group_descs[group],
                     "collective": name,
                     "dtype": f.dtype_names[dtype_code] if f.dtype_names else "",
                     "size_bytes": size, "instances": len(mine),
                     "ranks": members, "median_transfer_us": median,
                     "median_busbw_gbps": busbw})
    rows.sort(key=lambda r: (natural_key(r["group_desc"] or r["group"]),
                             natural_key(r["group"]), r["collective"], r["dtype"],
                             r["size_bytes"]))
    return rows


#: Groups offered in the heat map's menu, those with the most waiting first.
MAX_HEAT_GROUPS = 64
#: The heat map's most rows; a larger group's members are drawn in blocks (each cell the
#: largest of its block).
MAX_HEAT_ROWS = 128


def _heat_map(analysis: Analysis) -> tuple[Any, str]:
    """Per process group, its member ranks x profiler steps (instances in time order where no
    step is known), each cell how late the rank arrived at the group's collectives in that
    step (the most of them); one group shown at a time, picked from a menu: the group where
    the most waiting began first."""
    import numpy as np
    import plotly.io as pio
    from plotly.colors import sequential

    f = analysis.figures()
    unit, scale = ("ms", 1e3) if np.nanmax(f.skew, initial=0.0) >= 1e3 else ("us", 1.0)
    has_steps = bool(analysis.heat.get("by_step"))
    # the groups by the waiting that began in them (then by skew), at most MAX_HEAT_GROUPS
    weight = np.bincount(f.group, weights=f.blame, minlength=len(f.group_names))
    worst = np.zeros(len(f.group_names))
    np.maximum.at(worst, f.group, f.skew)
    present = np.unique(f.group)
    chosen = present[np.lexsort((present, -worst[present], -weight[present]))][:MAX_HEAT_GROUPS]
    inferno = [[k / (len(sequential.Inferno) - 1), color]  # (as plotly's check spells it)
               for k, color in enumerate(sequential.Inferno)]
    traces: list[dict[str, Any]] = []  # (plain dicts: plotly's objects check each one
    labels = []  # at length, a tenth of a second a page of many groups)
    tallest = 1
    width = len(analysis.ranks)
    # the cells (how late each rank arrived, the most per group, rank and step or bin), by
    # group: their keys are (group * width + column) * span + x
    keys, values = analysis.cells
    span = int(analysis.heat["span"])
    pair, x_all = keys // span, keys % span
    cell_group = pair // width
    group_at = np.searchsorted(cell_group, np.arange(len(f.group_names) + 1))
    axis_title = ("profiler step" if has_steps
                  else "the group's instances, in sequence order (binned)")
    for position, g in enumerate(chosen.tolist()):
        mine = slice(group_at[g], group_at[g + 1])
        column, late = pair[mine] % width, values[mine]
        members = np.unique(column)
        rows = np.searchsorted(members, column)
        # more members than a page has room for: blocks of consecutive members, each cell the
        # largest of its block (a late rank is never averaged away, nor drawn thinner than a
        # pixel)
        block = max(1, -(-len(members) // MAX_HEAT_ROWS))
        rows = rows // block
        key = x_all[mine] - 1 if has_steps else x_all[mine]
        steps, cols = np.unique(key, return_inverse=True)
        cells = np.full((-(-len(members) // block), len(steps)), -np.inf)
        np.maximum.at(cells, (rows.reshape(-1), cols.reshape(-1)), late / scale)
        cells[np.isneginf(cells)] = np.nan
        name = names.group_column(f.group_names[g], f.group_descs[g])
        labels.append(name)
        tallest = max(tallest, len(cells))
        traces.append(dict(  # (the keys in the order plotly writes them)
            colorbar={"title": {"text": f"late ({unit})"}}, colorscale=inferno,
            hovertemplate=f"%{{y}}<br>{'step' if has_steps else 'bin'} %{{x}}<br>late "
                          f"%{{z:.3f}} {unit}<extra>{name}</extra>",
            name=name, visible=position == 0,
            x=[("0 (warm-up)" if s == 0 and has_steps else str(s)) for s in steps.tolist()],
            y=_block_labels([analysis.ranks[c] for c in members.tolist()], block),
            z=_typed_array(cells), zmin=0, type="heatmap"))
    buttons = [{"args": [{"visible": [i == k for i in range(len(labels))]},
                         {"title": {"text": label}}], "label": label, "method": "update"}
               for k, label in enumerate(labels)]
    layout = dict(
        template=pio.templates[pio.templates.default].to_plotly_json(),
        title={"text": labels[0] if labels else ""},
        margin={"l": 110, "r": 20, "t": 60, "b": 50},
        xaxis={"title": {"text": axis_title}, "type": "category"},
        yaxis={"type": "category", "autorange": "reversed"},
        height=min(900, 300 + 12 * tallest))
    if len(buttons) > 1:
        layout["updatemenus"] = [{"buttons": buttons, "direction": "down", "x": 1.0,
                                  "xanchor": "right", "y": 1.15}]
    figure = {"data": traces, "layout": layout}
    note = ("How late each member rank arrived at its group's collectives, per "
            f"{'profiler step' if has_steps else 'stretch of instances'}: its arrival minus "
            "the first rank's, the most of the step's instances. Bright cells are the ranks "
            "the others waited for. One group at a time (the menu, top right): first the "
            "group where the most waiting began. A group of more than "
            f"{MAX_HEAT_ROWS} ranks is drawn in blocks of ranks, each cell the largest of its "
            "block (a late rank is never averaged away).")
    if len(present) > len(chosen):
        note += (f" The menu holds the {len(chosen)} groups with the most waiting of "
                 f"{len(present)}.")
    return figure, note


def _typed_array(values: Any) -> dict[str, str]:
    """A float array as plotly.js reads typed arrays (its documented ``dtype``/``bdata``/
    ``shape`` form: what plotly writes of a numpy array it has checked)."""
    import base64

    import numpy as np

    data = np.ascontiguousarray(values, dtype="<f8")
    return {"dtype": "f8", "bdata": base64.b64encode(data.tobytes()).decode("ascii"),
            "shape": ", ".join(str(n) for n in data.shape)}


def _block_labels(ranks: list[int], block: int) -> list[str]:
    """'rank 5' per row, or 'ranks 608-615' per block of ``block`` ranks."""
    if block == 1:
        return [f"rank {r}" for r in ranks]
    return [f"ranks {ranks[k]}-{ranks[min(len(ranks), k + block) - 1]}"
            for k in range(0, len(ranks), block)]


def _timeline(analysis: Analysis, around: int | None, span: int) -> tuple[Any, str] | None:
    """Bars per rank for the instances nearest in time to ``around`` (default: the largest
    skew) that the ranks shown took part in."""
    import numpy as np
    import plotly.graph_objects as go

    instances = analysis.instances
    if not instances:
        return None
    given = around is not None
    if around is None:  # where the most waiting began; else the largest skew past warm-up
        f = analysis.figures()
        skew = np.where(f.warmup & ~analysis.warmup_counted, -1.0, f.skew)
        around = int(np.argmax(f.blame)) if f.blame.any() else int(np.argmax(skew))
    f = analysis.figures()
    firsts = f.last - f.skew
    straggler = analysis.summary_of(instances[around])[0]
    here = analysis.launches_of(around)
    waits = np.full(len(analysis.ranks), -1.0)
    waits[here["column"]] = here["start"].max() - here["start"]
    picked: list[int] = []
    if straggler is not None:
        picked.append(analysis.ranks.index(straggler))
    picked += [int(c) for c in np.argsort(-waits, kind="stable")[:TIMELINE_RANKS // 2]
               if waits[c] >= 0 and c not in picked]
    rest = [c for c in range(len(analysis.ranks)) if c not in picked]
    step = max(1, len(rest) // max(1, TIMELINE_RANKS - len(picked)))
    picked += rest[::step][:max(0, TIMELINE_RANKS - len(picked))]
    picked.sort()
    from autoannot.traces.analysis.driver import rank_launches

    shown = rank_launches(analysis, picked)  # (their launches: read from their rows)
    instance = shown["instance"]
    column, start, end, waits = shown["column"], shown["start"], shown["end"], shown["wait"]
    # the instances of those ranks nearest in time to the chosen one
    candidates = np.unique(instance)
    profiler_step = int(f.step[around])
    if profiler_step >= 0:  # one profiler step: the instances of the chosen one's step
        candidates = candidates[f.step[candidates] == profiler_step]
    by_time = candidates[np.argsort(firsts[candidates], kind="stable")]
    at = int(np.flatnonzero(by_time == around)[0])
    chosen = set(by_time[max(0, at - span): at + span + 1].tolist())
    origin = min(firsts[i] for i in chosen)
    bars: dict[str, dict[str, list[Any]]] = {
        "wait": {"y": [], "base": [], "x": [], "text": []},
        "move": {"y": [], "base": [], "x": [], "text": []}}
    for i, index in enumerate(instance.tolist()):
        if index not in chosen:
            continue
        one = instances[index]
        label = f"rank {analysis.ranks[int(column[i])]}"
        what = f"{one.group_desc or one.group} #{one.seq} {one.collective}"
        waited = float(waits[i])  # (bounded by the rank's own time in it)
        bars["wait"]["y"].append(label)
        bars["wait"]["base"].append((start[i] - origin) / 1e3)
        bars["wait"]["x"].append(max(0.0, waited / 1e3))
        bars["wait"]["text"].append(f"{what}: waited {us_text(waited)}")
        if end[i] == end[i]:
            moved = end[i] - start[i] - waited
            bars["move"]["y"].append(label)
            bars["move"]["base"].append((start[i] + waited - origin) / 1e3)
            bars["move"]["x"].append(max(0.0, moved / 1e3))
            bars["move"]["text"].append(f"{what}: in the collective {us_text(moved)} after "
                                        "waiting")
    figure = go.Figure()
    figure.add_bar(orientation="h", name="waiting for the last rank", marker_color="#b8b8b8",
                   hovertemplate="%{text}<extra></extra>", textposition="none", **bars["wait"])
    if bars["move"]["x"]:
        figure.add_bar(orientation="h", name="in the collective, after waiting",
                       marker_color="#1f77b4", hovertemplate="%{text}<extra></extra>",
                       textposition="none", **bars["move"])
    figure.update_layout(barmode="overlay", height=160 + 26 * len(picked),
                         margin={"l": 90, "r": 20, "t": 30, "b": 50},
                         xaxis_title="ms from the first arrival shown",
                         yaxis={"autorange": "reversed", "type": "category",
                                "categoryorder": "array",
                                "categoryarray": [f"rank {analysis.ranks[c]}" for c in picked]},
                         legend={"orientation": "h"})
    i = instances[around]
    note = (f"{f'Profiler step {profiler_step}: t' if profiler_step >= 0 else 'T'}he "
            f"{len(chosen)} "
            f"instances nearest in time to #{i.seq} of "
            f"{i.group_desc or i.group} ({i.collective}, the "
            f"{'chosen instance' if given else 'instance where the most waiting began'}), on "
            f"{len(picked)} of {len(analysis.ranks)} ranks: the straggler, those that waited "
            "most, and others spread over the job. Grey: waiting for the last rank to arrive "
            "(never more than the rank's own time in the collective); blue: the rest of its "
            "time in it, to its end.")
    if not bars["move"]["x"]:
        note += " No transfer is known here: these times are launches' entry times."
    return figure, note


def _table(headers: list[str], rows: list[list[str]], css: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                   for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1200px;
       color: #222; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
.lead { font-size: 16px; background: #fff4e5; border-left: 4px solid #f0a030;
        padding: 8px 12px; }
.note { color: #555; font-size: 13px; max-width: 1000px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; }
th { background: #f4f4f4; } .ok { color: #1a7f37; } .bad { color: #b42318; }
"""

#: Marks the page rendered (every figure drawn) or failed (a script error), for checks.
_CHECK = """
window.addEventListener("error", function (e) {
  var list = document.body.dataset.errors ? document.body.dataset.errors + " | " : "";
  document.body.dataset.errors = list + (e.message || "error");
});
window.addEventListener("load", function () {
  var figures = document.querySelectorAll(".plotly-graph-div");
  var drawn = 0;
  figures.forEach(function (f) { if (f.querySelector(".main-svg")) drawn += 1; });
  document.body.dataset.figures = figures.length;
  document.body.dataset.drawn = drawn;
});
"""


def render(analysis: Analysis, inputs: list[str], title: str | None = None,
           around: int | None = None, span: int = 10) -> str:
    """The page's HTML."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    from autoannot.traces.units import size_text as _size

    parts: list[str] = []

    def figure_html(figure: Any, name: str) -> str:
        return pio.to_html(figure, full_html=False, include_plotlyjs=False, div_id=name,
                           config={"displaylogo": False, "responsive": True},
                           validate=not isinstance(figure, dict))  # (a dict: made as checked)

    ranked = stragglers(analysis)
    instances = analysis.instances
    heading = title or f"Collectives of {len(analysis.ranks)} ranks"
    parts.append(f"<h1>{html.escape(heading)}</h1>")
    parts.append(f'<p class="note">{len(instances)} collective instances on '
                 f"{len(analysis.ranks)} ranks, from {html.escape(_inputs(inputs))}.</p>")
    from autoannot.traces.render.skew import lead

    for line in lead(analysis):
        kind = next((k for k in ("MISMATCH", "HANG", "MISSING") if line.startswith(k + ": ")),
                    "blocked" if line.startswith("  blocked: ") or line.startswith("  ... ")
                    else None)
        parts.append(f'<p class="lead{" bad" if kind else ""}" '
                     f'id="{kind.lower() if kind else "straggler"}">'
                     f"{html.escape(line.strip())}</p>")
    if not instances:
        parts.append('<p class="lead" id="straggler">No collective instance to line up.</p>')

    parts.append("<h2>Who was late, and how late</h2>")
    if instances:
        heat, note = _heat_map(analysis)
        parts.append(figure_html(heat, "heat-map"))
        parts.append(f'<p class="note">{html.escape(note)}</p>')

    parts.append("<h2>Where the waiting began</h2>")
    origins = analysis.origins()
    if origins:
        blamed_unit, blamed_scale = _unit([o["blamed_us"] for o in origins])
        late_unit, late_scale = _unit([o["late_us"] for o in origins])
        parts.append(_table(
            ["rank", f"others waited for it ({blamed_unit})", f"late by ({late_unit})", "step",
             "instance", "call site"],
            [[o["rank"], f"{o['blamed_us'] / blamed_scale:.4g}",
              f"{o['late_us'] / late_scale:.4g}",
              o["step"] if o["step"] >= 0 else "-",
              f"{o['group_desc'] or o['group']} #{o['seq']} {o['collective']}",
              o["call_site"] or "-"] for o in origins], "origins"))
        parts.append('<p class="note">Each delay is blamed once, on the rank and call site '
                     "where it began: a rank late only because it waited at its previous "
                     "collective passes the blame back to where that wait began. Warm-up "
                     "(profiler step 0, each group's first collective) is left out unless "
                     "--include-warmup.</p>")
    else:
        parts.append("<p>None.</p>")

    parts.append("<h2>Stragglers</h2>")
    if ranked:
        waited_unit, waited_scale = _unit([r["others_waited_for_it_us"] for r in ranked])
        worst_unit, worst_scale = _unit([r["worst_skew_us"] for r in ranked])
        parts.append(_table(
            ["rank", "last to arrive", f"others waited for it ({waited_unit})",
             "its worst instance", f"late by ({worst_unit})", "call site there"],
            [[r["rank"], r["last_to_arrive"],
              f"{r['others_waited_for_it_us'] / waited_scale:.4g}",
              f"{r['group_desc'] or r['group']} #{r['seq']} {r['collective']}",
              f"{r['worst_skew_us'] / worst_scale:.4g}", r["call_site"] or "-"]
             for r in ranked],
            "stragglers"))
    else:
        parts.append("<p>None.</p>")

    parts.append("<h2>Transfer time and bus bandwidth per group</h2>")
    by_group = _by_kind(group_rows(analysis))
    transfer_unit, transfer_scale = _unit([r["median_transfer_us"] for r in by_group])
    parts.append(_table(
        ["group", "collective", "dtype", "size", "instances", "ranks",
         f"median transfer ({transfer_unit})", "median bus bw (GB/s)"],
        [[r.get("label") or names.group_column(r["group"], r["group_desc"]), r["collective"],
          r["dtype"] or "?",
          _size(r["size_bytes"]), r["instances"], r["ranks"],
          "unknown" if r["median_transfer_us"] is None
          else f"{r['median_transfer_us'] / transfer_scale:.3g}",
          "-" if r["median_busbw_gbps"] is None else f"{r['median_busbw_gbps']:.3g}"]
         for r in by_group], "groups"))
    parts.append('<p class="note">The transfer is the last rank\'s own time in the collective, '
                 "from its arrival to its end (waiting is not bandwidth); bus bandwidth uses "
                 "nccl-tests' factors. Unknown where only entry times are known (record files "
                 "alone). gloo's times are CPU ranges. Groups of one description and size (a "
                 "job's tensor-parallel groups) share a row: its median is the median of their "
                 "medians (<code>autoannot summary</code> lists each group).</p>")

    parts.append("<h2>Do the ranks agree?</h2>")
    if analysis.problems:
        parts.append(f'<p class="bad" id="verdict">{len(analysis.problems)} things do not '
                     "match across ranks:</p><ul>" + "".join(
                         f"<li>{html.escape(p)}</li>" for p in analysis.problems) + "</ul>")
    else:
        parts.append(f'<p class="ok" id="verdict">Yes: every one of the {len(instances)} '
                     "instances was launched by all its group's ranks, with the same collective "
                     "and size at the same place in the group's sequence.</p>")

    timeline = _timeline(analysis, around, span)
    if timeline is not None:
        parts.append("<h2>One step, rank by rank</h2>")
        parts.append(figure_html(timeline[0], "timeline"))
        parts.append(f'<p class="note">{html.escape(timeline[1])}</p>')

    said = [*analysis.notes, *_clock_notes(analysis)]
    if said:
        parts.append("<h2>What these times can and cannot say</h2><ul>"
                     + "".join(f"<li>{html.escape(n)}</li>" for n in said) + "</ul>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(heading)}</title><style>{_STYLE}</style>"
            f"<script>{_CHECK}</script><script>{get_plotlyjs()}</script></head><body>"
            + "\n".join(parts) + "</body></html>\n")


def _by_kind(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of groups that share a description and size (tp0 ... tp1023) as one row each per
    collective, dtype and size: instances added up, the median of the groups' medians."""
    import statistics

    from autoannot.traces.analysis.matching import natural_key

    kinds: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        kind = (r["group_desc"] or r["group"], r["ranks"], r["collective"], r["dtype"],
                r["size_bytes"])
        kinds.setdefault(kind, []).append(r)
    merged = []
    for members in kinds.values():
        if len(members) == 1 or not members[0]["group_desc"]:
            merged += members
            continue
        names = sorted((r["group"] for r in members), key=natural_key)
        known = [r for r in members if r["median_transfer_us"] is not None]
        merged.append({**members[0], "group": names[0],
                       "label": f"{members[0]['group_desc']} ({len(members)} groups: "
                                f"{names[0]} ... {names[-1]})",
                       "instances": sum(r["instances"] for r in members),
                       "median_transfer_us": statistics.median(
                           r["median_transfer_us"] for r in known) if known else None,
                       "median_busbw_gbps": statistics.median(
                           r["median_busbw_gbps"] for r in known) if known else None})
    return merged


def _unit(values_us: list[float | None]) -> tuple[str, float]:
    """One unit for a column of times: ms where its largest is 10 ms or more, else us."""
    largest = max((v for v in values_us if v is not None), default=0.0)
    return ("ms", 1e3) if largest >= 1e4 else ("us", 1.0)


def _inputs(inputs: list[str]) -> str:
    shown = ", ".join(inputs[:4])
    return shown + (f" and {len(inputs) - 4} more" if len(inputs) > 4 else "")


def _clock_notes(analysis: Analysis) -> list[str]:
    fitted = [c for c in analysis.clocks if c.instances]
    applied = [c for c in fitted if c.applied]
    notes = []
    if applied:
        notes.append(f"{len(applied)} ranks' clock offsets were fitted on GPU kernels' end "
                     "times and taken out (a clock offset is not skew).")
    if not fitted:
        notes.append("No clock was fitted (no GPU kernels): ranks' times are taken as one "
                     "clock — right on one host; across hosts only as good as their clocks.")
    return notes

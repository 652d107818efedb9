"""``autoannot skew``'s text, JSON and CSV: the analysis (``lineup.analyze_files``) as the
user reads it — missing ranks first, then where the largest delay began, the stragglers, the
largest skews, each rank's waiting, the clocks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from autoannot.traces import files, names
from autoannot.traces.analysis.matching import IN_STEP_US, Analysis, describe_missing
from autoannot.traces.analysis.matching import count as count_of


def us_text(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e3:.2f} ms" if value >= 1e4 else f"{value:.1f} us"


def lead(analysis: Analysis) -> list[str]:
    """The first lines to say of an analysis: the ranks' mismatches, then a hang's culprit and
    who waits on it (``hang``), else missing ranks (never an all-clear while a rank is
    missing), else where the largest delay began, where a rank stands out of the job's own
    noise (``Analysis.standing_out``), else that none does. While ranks are missing (a hang, a
    rank's files lost) no straggler leads: the ranks missing are the story, and the ranking
    knows nothing of them (it stays in the body)."""
    lines = list(analysis.mismatches)
    if analysis.hang_lead:  # (a hang explained: its culprit, then who waits where)
        return lines + analysis.hang_lead
    lines += [f"MISSING: {describe_missing(entry)}" for entry in analysis.missing]
    if lines:
        return lines
    origins = analysis.origins(1)
    top = analysis.standing_out() if origins else None
    if origins and top is None:
        one = origins[0]
        lines.append(
            f"no rank stands out of the job's own noise: the largest delay, rank {one['rank']} "
            f"arriving {us_text(one['late_us'])} late at {one['group_desc'] or one['group']} "
            f"#{one['seq']} {one['collective']}, is within what the other ranks also did")
    elif top is not None:
        lines.append(
            f"rank {top['rank']} held the others up most: {us_text(top['blamed_us'])} of their "
            f"waiting began where it arrived {us_text(top['late_us'])} late, at "
            f"{top['group_desc'] or top['group']} #{top['seq']} {top['collective']}"
            + (f" (step {top['step']})" if top["step"] >= 0 else "")
            + f" {'at ' + top['call_site'] if top['call_site'] else '(no call site recorded)'}")
    elif analysis.instances:
        lines.append("no delay found outside warm-up: every instance started within "
                     f"{IN_STEP_US:g} us on its ranks, or its lateness came from warm-up"
                     if not analysis.warmup_counted else
                     f"no rank arrived late: every instance started within {IN_STEP_US:g} us")
    return lines


def warmup_note(analysis: Analysis) -> str | None:
    """What was left out of the ranking as warm-up, if anything."""
    if analysis.warmup_counted or not len(analysis.instances):
        return None
    f = analysis.figures()
    count = int(f.warmup.sum())
    if not count:
        return None
    worst = float(f.skew[f.warmup].max())
    return (f"{count_of(count, 'warm-up instance')} (profiler step 0, and each group's first "
            "collective: process and communicator start-up; without profiler steps also each "
            f"rank's first after its profiler started; largest skew {us_text(worst)}): shown "
            "but left out of the ranking (--include-warmup counts them)")


def format_report(analysis: Analysis, top: int = 10) -> str:
    by_skew = analysis.largest_skews(top)
    column = {rank: c for c, rank in enumerate(analysis.ranks)}
    lines = [*lead(analysis),
             f"{len(analysis.instances)} collective instances on {len(analysis.ranks)} ranks",
             "",
             f"{'rank':>4} {'waited in collectives':>22} {'others waited for it':>21} "
             f"{'last to arrive':>15}"]
    for r in analysis.per_rank():
        lines.append(f"{r['rank']:>4} {us_text(r['waited_us']):>22} "
                     f"{us_text(r['others_waited_for_it_us']):>21} {r['last_to_arrive']:>15}")
    origins = analysis.origins(top)
    if origins:
        lines += ["", "where the waiting began (each delay blamed once, where it started):",
                  f"{'rank':>4} {'blamed':>10} {'late by':>10} {'step':>4}  {'group':14} "
                  f"{'#':>5} {'collective':24} call site"]
        for o in origins:
            group = names.group_column(o["group"], o["group_desc"])
            lines.append(f"{o['rank']:>4} {us_text(o['blamed_us']):>10} "
                         f"{us_text(o['late_us']):>10} "
                         f"{o['step'] if o['step'] >= 0 else '-':>4}  {group[:14]:14} "
                         f"{o['seq']:>5} {o['collective'][:24]:24} {o['call_site'] or '-'}")
    lines += ["", f"top {len(by_skew)} instances by skew:",
              f"{'group':14} {'#':>5} {'collective':24} {'size':>10} {'last':>5} {'skew':>10} "
              f"{'transfer':>10}  call site (the last rank's)"]
    from autoannot.traces.units import size_text as _size

    for instance in by_skew:
        straggler, skew, transfer, _ = analysis.summary_of(instance)
        site = (analysis.site(instance.index, column[straggler]) if straggler is not None
                else None)
        group = names.group_column(instance.group, instance.group_desc)
        lines.append(f"{group[:14]:14} {instance.seq:>5} {instance.collective[:24]:24} "
                     f"{_size(instance.size_bytes):>10} "
                     f"{'-' if straggler is None else straggler:>5} {us_text(round(skew, 3)):>10} "
                     f"{us_text(None if transfer is None else round(transfer, 3)):>10}  "
                     f"{site or '-'}")
    fitted = [c for c in analysis.clocks if c.instances]
    if fitted:
        lines += ["", "clocks (each rank's offset from rank "
                  f"{analysis.clocks[0].rank}'s, fitted on the instances' end times):"]
        for c in fitted:
            lines.append(f"  rank {c.rank}: {c.offset_us:+.1f} us, spread {c.spread_us:.1f} us "
                         f"over {c.instances} instances: "
                         + ("taken out" if c.applied else "within its spread: left as is"))
    for problem in analysis.problems:
        lines.append(f"not matched: {problem}")
    for note in [*analysis.notes, warmup_note(analysis)]:
        if note:
            lines.append(f"note: {note}")
    return "\n".join(lines)


CSV_FIELDS = ("group", "group_desc", "seq", "collective", "size_bytes", "straggler", "skew_us",
              "transfer_us", "busbw_gbps", "rank", "start_us", "wait_us", "call_site")


def write_json(analysis: Analysis, path: Path) -> None:
    """One row per instance, each made and written in turn (a job of a million instances of
    thousands of ranks is never held as one text)."""
    def pieces() -> Iterator[str]:
        yield "["
        for number, instance in enumerate(analysis.instances):
            yield ("\n" if number == 0 else ",\n") + json.dumps(analysis.row(instance))
        yield "\n]\n"

    files.atomic_write_lines(str(path), pieces())


def write_csv(analysis: Analysis, path: Path) -> None:
    """One CSV row per instance and rank, written an instance at a time."""
    import csv
    import io

    def pieces() -> Iterator[str]:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(CSV_FIELDS)
        for instance in analysis.instances:
            row = analysis.row(instance)
            head = [row[k] for k in CSV_FIELDS[:9]]
            for rank, part in row["ranks"].items():
                writer.writerow([*head, rank, part["start_us"], part["wait_us"],
                                 part["call_site"]])
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
        yield buffer.getvalue()

    files.atomic_write_lines(str(path), pieces())

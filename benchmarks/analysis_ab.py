"""Two versions of the cross-rank analysis on the same rows, alternated in one run: the ratios of
wall time and of the process tree's peak memory, this tree's ÷ the other's.

    git archive 9141d7a autoannot benchmarks | (mkdir -p /tmp/base && tar -x -C /tmp/base)
    python benchmarks/analysis_ab.py /tmp/base [--sizes 1024x2000,8192x2000] [--rounds 2]
        [--commands skew,report] [--rows FOLDER] [-o OUT.json]

For each size (ranks x instances a rank) the rows are written once, by the base tree's own
writer (``benchmarks/report_scale.py``'s job: an all-reduce of the default group and of an
8-rank group, one rank late at every 10th default-group instance), so both versions read the
same files (this tree reads every earlier rows version). Then, ``--rounds`` times, each command
runs under each tree in turn (``python -m autoannot COMMAND``, ``PYTHONPATH=TREE``), base first
in odd rounds and this tree first in even ones; the time is the wall time of the command, the
memory the peak resident set of its whole process tree (a pool's workers counted), sampled
every 50 ms (``report_scale.timed``). Prints a table of the medians and their ratios, then one
line of JSON. A benchmark, not a test: it never fails on a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
THIS_TREE = HERE.parent
sys.path.insert(0, str(HERE))

import report_scale  # noqa: E402


def write_rows(tree: Path, folder: Path, ranks: int, instances: int) -> None:
    """The job's rows, by ``tree``'s own writer (its ``benchmarks/report_scale.py``)."""
    folder.mkdir(parents=True)
    code = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            "import report_scale; report_scale.write_rows(Path(sys.argv[2]), int(sys.argv[3]), "
            "int(sys.argv[4]))")
    subprocess.run([sys.executable, "-c", code, str(tree / "benchmarks"), str(folder),
                    str(ranks), str(instances)],
                   env={**os.environ, "PYTHONPATH": str(tree)}, cwd=folder.parent, check=True)


def command_line(command: str, folder: Path, out: Path) -> list[str]:
    cli = [sys.executable, "-m", "autoannot"]
    if command == "skew":
        return [*cli, "skew", str(folder), "-q", "--top", "10"]
    return [*cli, "report", str(folder), "-q", "-o", str(out / "report.html")]


def warm(folder: Path) -> None:
    """Every rows file read once: each command starts from the same page cache (at 8,192 x
    20,000 the rows are 8.3 GB, near what this machine caches, and whatever ran before
    leaves a different part of them on disk)."""
    for path in sorted(folder.iterdir()):
        with open(path, "rb") as handle:
            while handle.read(1 << 24):
                pass


def run(tree: Path, command: str, folder: Path, scratch: Path) -> tuple[float, float, int]:
    """Seconds, peak MiB and exit status of one command under ``tree`` (the rows read once
    before: ``warm``)."""
    warm(folder)
    out = Path(tempfile.mkdtemp(dir=scratch))
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree)
    try:
        seconds, mib, code, _ = report_scale.timed(command_line(command, folder, out),
                                                   out / "said.txt")
    finally:
        if previous is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = previous
    return seconds, mib, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path, help="the other tree (its autoannot and benchmarks)")
    parser.add_argument("--sizes", default="1024x2000,8192x2000",
                        help="ranks x instances, comma-separated (default 1024x2000,8192x2000)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--commands", default="skew,report")
    parser.add_argument("--dir", help="where to write the rows (default: a temporary folder)")
    parser.add_argument("--rows", type=Path,
                        help="rows the base's writer wrote before, of the one size given: read, "
                             "not written (nor removed)")
    parser.add_argument("-o", "--output", help="also write the JSON here")
    args = parser.parse_args()
    if args.rows and "," in args.sizes:
        parser.error("--rows: give the one size they are (--sizes RANKSxINSTANCES)")
    base = args.base.resolve()
    trees = {"base": base, "this": THIS_TREE}
    commands = args.commands.split(",")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        os.chdir(tmp)  # (the commands' first sys.path entry: no autoannot found there)
        for size in args.sizes.split(","):
            ranks, instances = (int(x) for x in size.lower().split("x"))
            if args.rows:
                folder = args.rows.resolve()
                if len(list(folder.glob("*.rows"))) != ranks:
                    parser.error(f"--rows {folder}: not {ranks} ranks' rows files")
            else:
                folder = Path(tmp, f"rows_{ranks}x{instances}")
                print(f"{size}: writing the rows (the base's writer) ...", file=sys.stderr)
                write_rows(base, folder, ranks, instances)
            seen: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
            for round_ in range(args.rounds):
                order = ["base", "this"] if round_ % 2 == 0 else ["this", "base"]
                for command in commands:
                    for name in order:
                        measured = run(trees[name], command, folder, Path(tmp))
                        seen.setdefault((command, name), []).append(measured)
                        print(f"  {size} {command:6} {name:4} round {round_ + 1}: "
                              f"{measured[0]:6.1f} s {measured[1]:7.0f} MiB exit {measured[2]}",
                              file=sys.stderr)
            results[size] = {}
            for command in commands:
                median = {name: (statistics.median(s for s, _, _ in seen[(command, name)]),
                                 statistics.median(m for _, m, _ in seen[(command, name)]))
                          for name in trees}
                results[size][command] = {
                    "base_s": round(median["base"][0], 2), "this_s": round(median["this"][0], 2),
                    "base_mib": round(median["base"][1]), "this_mib": round(median["this"][1]),
                    "time_ratio": round(median["this"][0] / median["base"][0], 2),
                    "memory_ratio": round(median["this"][1] / median["base"][1], 2),
                    "exits": sorted({code for name in trees
                                     for _, _, code in seen[(command, name)]}),
                    "runs": {name: [[round(s, 2), round(m)] for s, m, _ in seen[(command, name)]]
                             for name in trees}}
            if not args.rows:
                import shutil

                shutil.rmtree(folder)
    print(f"{'rows':14} {'command':8} {'base s':>8} {'this s':>8} {'time x':>7} "
          f"{'base MiB':>9} {'this MiB':>9} {'memory x':>9}")
    for size, per_command in results.items():
        for command, r in per_command.items():
            print(f"{size:14} {command:8} {r['base_s']:8.1f} {r['this_s']:8.1f} "
                  f"{r['time_ratio']:7.2f} {r['base_mib']:9} {r['this_mib']:9} "
                  f"{r['memory_ratio']:9.2f}")
    figures = {"base": str(base), "cores": os.cpu_count(), "rounds": args.rounds,
               "results": results}
    print(json.dumps(figures))
    if args.output:
        Path(args.output).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

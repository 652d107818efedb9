"""Two versions of the agent, counted in CPU instructions (callgrind), through the public API
only, so that any earlier version can be counted the same way.

    git archive OLD_COMMIT autoannot | (mkdir -p /tmp/old && tar -x -C /tmp/old)
    python benchmarks/instructions_ab.py /tmp/old [--calls N] [--gloo] [-o OUT.json]

For each version (OLD_DIR's ``autoannot`` and this tree's), with its native observer where it is
built and without it (``AUTOANNOT_NATIVE=0``), counts N calls of each mode: ``dist.all_reduce``
unwrapped, inside the tutorial's hand-written helper, through the agent idle (fast path), and
annotating with a recorder open — ``record()`` as it is by default, recording the Python API's
launches only, and recording every launch; then a C++-origin ``pg.allreduce`` and a compiled
op's ``_c10d_functional.all_reduce`` without and with a recorder that sees them. A fake group of
2 (no communication: the pure overhead), or with ``--gloo`` a real 2-rank gloo group (rank 1 runs
the same calls outside valgrind). Where the version keeps rings, the Python API's call, the
``pg.allreduce`` and the compiled op again with a ring open (as ``AUTOANNOT_RING`` opens one).
``--layers python`` counts without the native observer alone. Build each version's native
observer first (``python -m autoannot build-native`` in each tree). Prints the instructions
each mode adds to the unwrapped call, side by side, then one line of JSON. A benchmark, not a
test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import instructions  # noqa: E402

MODES = ("fast path", "annotating, default", "annotating, Python API only",
         "annotating, every launch", "tutorial helper")


def child(folder: str, calls: int) -> None:
    """Under callgrind (rank 0) or beside it (rank 1 of --gloo): every mode."""
    import contextlib
    import ctypes
    import inspect

    import torch
    import torch.distributed as dist

    import autoannot

    helper = ctypes.CDLL(os.path.join(folder, "counting.so"))
    if os.environ.get("AB_GLOO"):
        rank = int(os.environ["AB_RANK"])
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['AB_PORT']}",
                                rank=rank, world_size=2)
    else:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        rank = 0
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    group, tensor = dist.group.WORLD, torch.ones(16)
    original = dist.distributed_c10d.all_reduce

    def count(name: str, call: object) -> None:
        instructions._counted(helper, name, call, calls)

    def hand_written() -> None:
        ranks = dist.get_process_group_ranks(group)
        annotation = {"name": "all_reduce", "In msg nelems": tensor.numel(),
                      "Out msg nelems": tensor.numel(), "Group size": len(ranks),
                      "dtype": str(tensor.dtype).removeprefix("torch."),
                      "Process Group Name": group.group_name,
                      "Process Group Description": group.group_desc,
                      "Process Group Ranks": ranks}
        mark = getattr(getattr(torch.cuda, "_graph_annotations", None), "mark_kernels", None)
        with mark(annotation) if mark is not None else contextlib.nullcontext():
            original(tensor, group=group)

    # record()'s options by version: python_api_only=True now; dispatcher=True before it was
    # the default (issue 27)
    params = inspect.signature(autoannot.record).parameters
    api_only = {"python_api_only": True} if "python_api_only" in params else {}
    every = {} if "python_api_only" in params else {"dispatcher": True}
    autoannot.enable()
    autoannot.disable()
    count("unwrapped", lambda: original(tensor, group=group))
    count("tutorial helper", hand_written)
    autoannot.enable()
    proxy = dist.all_reduce
    if proxy is original:
        raise RuntimeError("the agent did not wrap dist.all_reduce")
    count("fast path", lambda: proxy(tensor, group=group))
    for name, options in (("annotating, default", {}), ("annotating, Python API only", api_only),
                          ("annotating, every launch", every)):
        with autoannot.record(**options) as records:
            count(name, lambda: proxy(tensor, group=group))
        if len(records) < calls:
            raise RuntimeError(f"{name}: {len(records)} of {calls} calls recorded")
    options = dist.AllreduceOptions()
    functional = torch.ops._c10d_functional
    below = {"pg.allreduce": lambda: group.allreduce([tensor], options).wait(),
             "compiled op": lambda: functional.wait_tensor(
                 functional.all_reduce(tensor, "sum", group.group_name))}
    for name, call in below.items():
        count(name, call)
        with autoannot.record(**every) as records:
            count(f"{name}, recorded", call)
        if rank == 0 and len(records) < calls:
            raise RuntimeError(f"{name}: {len(records)} of {calls} calls recorded")
    ring = _ring(folder)
    if ring is not None:  # the always-on ring, where the version has one (opened as at start-up)
        from autoannot.agent.instrumentation import INSTRUMENTATION

        autoannot.disable()  # (opened before enable(), as AUTOANNOT_RING opens it at start-up:
        INSTRUMENTATION.state.open_journal(ring)  # the Python layer held for good)
        autoannot.enable()
        proxy = dist.all_reduce
        for name, call in {"ring": lambda: proxy(tensor, group=group), **below}.items():
            before = ring.count if hasattr(ring, "count") else None
            count(name if name == "ring" else f"{name}, ring", call)
            if before is not None and rank == 0 and ring.count - before < calls:
                raise RuntimeError(f"{name}: {ring.count - before} of {calls} calls in the ring")
        INSTRUMENTATION.state.close_journal(ring)
    if rank == 0:  # what saw the launches below the Python API (checked by the parent)
        from autoannot.agent import instrumentation

        agent = instrumentation.INSTRUMENTATION
        native = (getattr(agent, "observer", None) is not None
                  or getattr(getattr(agent, "hooks", None), "native", None) is not None)
        Path(folder, "observer").write_text("native" if native else "python")
    autoannot.disable()
    dist.destroy_process_group()


def _ring(folder: str) -> object:
    """A ring of 4,096 launches in ``folder`` where this version keeps rings; else None."""
    try:
        from autoannot.keep.ring import Ring
    except ImportError:
        return None
    return Ring(os.path.join(folder, "ring"), 4096)


def count_version(tree: Path, native: bool, calls: int, gloo: bool) -> dict[str, float]:
    """Mode -> instructions a call, for the autoannot package in ``tree``."""
    with tempfile.TemporaryDirectory(prefix="autoannot-ab-") as folder:
        source = Path(folder, "counting.c")
        source.write_text(instructions.HELPER)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(Path(folder, "counting.so")),
                        str(source)], check=True)
        env = {k: v for k, v in os.environ.items()  # (each tree's build, where it is)
               if not k.startswith("AUTOANNOT") or k == "AUTOANNOT_NATIVE_DIR"}
        env.update(PYTHONPATH=str(tree), PYTHONHASHSEED="0")
        if not native:
            env["AUTOANNOT_NATIVE"] = "0"
        command = [sys.executable, __file__, "--child", folder, "--calls", str(calls)]
        peer = None
        if gloo:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            env.update(AB_GLOO="1", AB_PORT=str(port))
            peer = subprocess.Popen(command, env={**env, "AB_RANK": "1"}, cwd=tree,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        ran = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
             f"--callgrind-out-file={folder}/callgrind.out.%p", *command],
            env={**env, "AB_RANK": "0"}, cwd=tree, capture_output=True, text=True)
        if peer is not None:
            peer.wait()
        if ran.returncode != 0:
            raise RuntimeError(f"counting {tree} failed:\n{ran.stderr[-3000:]}")
        observer = Path(folder, "observer")
        if native and observer.exists() and observer.read_text() != "native":
            raise RuntimeError(f"{tree}: no native module built for it in AUTOANNOT_NATIVE_DIR "
                               "(python -m autoannot build-native there first), or it failed "
                               "to load: its native figures would be the Python layer's")
        return {mode: total / calls for mode, total in instructions._totals(folder).items()}


def added(per_call: dict[str, float]) -> dict[str, int]:
    """Instructions each mode adds to its own unwrapped call."""
    base = per_call["unwrapped"]
    result = {mode: round(per_call[mode] - base) for mode in MODES}
    for name in ("pg.allreduce", "compiled op"):
        result[f"{name}, recorded"] = round(per_call[f"{name}, recorded"] - per_call[name])
    if "ring" in per_call:  # (a version that keeps rings)
        result["ring"] = round(per_call["ring"] - base)
        for name in ("pg.allreduce", "compiled op"):
            result[f"{name}, ring"] = round(per_call[f"{name}, ring"] - per_call[name])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", nargs="?", help="a folder holding the other version's autoannot/")
    parser.add_argument("--calls", type=int, default=2000, help="calls per mode (default 2000)")
    parser.add_argument("--gloo", action="store_true", help="a real 2-rank gloo group")
    parser.add_argument("--layers", default="native,python",
                        help="which to count, comma-separated: native (the native observer "
                             "where built), python (AUTOANNOT_NATIVE=0); default both")
    parser.add_argument("-o", "--output", help="also write the JSON line here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.calls)
        return 0
    if args.old is None or not Path(args.old, "autoannot", "__init__.py").is_file():
        parser.error("OLD: a folder holding an autoannot/ package")
    missing = instructions._missing()
    if missing:
        print(f"instructions_ab.py: cannot count here: no {missing}", file=sys.stderr)
        return 2
    versions = {"old": Path(args.old).resolve(), "new": HERE.parent}
    table: dict[str, dict[str, dict[str, int]]] = {}
    layers = [name.strip() for name in args.layers.split(",") if name.strip()]
    if not layers or set(layers) - {"native", "python"}:
        parser.error(f"--layers {args.layers!r}: native, python or both")
    for layer, native in (("native", True), ("python", False)):
        if layer not in layers:
            continue
        for version, tree in versions.items():
            print(f"counting {version}, {layer} ...", file=sys.stderr, flush=True)
            table.setdefault(layer, {})[version] = added(
                count_version(tree, native, args.calls, args.gloo))
    group = "a 2-rank gloo group" if args.gloo else "a fake group of 2"
    for layer, versions_added in table.items():
        print(f"\n{layer} layer: instructions added a call, dist.all_reduce on {group}")
        print(f"{'mode':34} {'old':>9} {'new':>9} {'new/old':>8}")
        for mode in versions_added["new"]:
            if mode not in versions_added["old"]:
                continue
            old, new = versions_added["old"][mode], versions_added["new"][mode]
            print(f"{mode:34} {old:9,} {new:9,} {new / old if old else float('nan'):8.2f}")
        for mode in MODES[1:4]:
            ratios = [versions_added[v][mode] / versions_added[v]["tutorial helper"]
                      for v in ("old", "new")]
            print(f"{mode + ' / helper':44} {ratios[0]:8.3f} {ratios[1]:8.3f}")
    result = {"calls": args.calls, "group": group, "old": str(versions["old"]),
              "added": table}
    line = json.dumps(result)
    print(line)
    if args.output:
        Path(args.output).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

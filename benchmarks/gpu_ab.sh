#!/usr/bin/env bash
# Two versions of the agent on one GPU machine, in alternating processes: what a change did to
# the capture benchmark, free of the drift between machines and sessions (an agent-off decoder
# set has ranged 15-44 ms across processes of one run).
#
#     git archive OLD_COMMIT autoannot | (mkdir -p ab_old && tar -x -C ab_old)   # before carrying
#     bash benchmarks/gpu_ab.sh ab_old OUT [PAIRS]
#
# Both versions run this tree's benchmark scripts (copied into OLD_DIR/benchmarks), each with
# its own autoannot package. Builds the native observer of each version, then runs
# benchmarks/gpu_capture.py PAIRS times (default 2) for each, old and new alternating (ROUNDS=6,
# PROCESS_ROUNDS=1, WORLD=1 unless set; WORKLOADS=ddp for one workload), then
# benchmarks/gpu_graph.py GRAPH_PAIRS times (default 0) the same way, and prints each run's
# figures side by side (and writes them to OUT/ab_summary.json). No run starts after DEADLINE
# seconds (default 520) from the start.
set -u
OLD=${1:?usage: gpu_ab.sh OLD_DIR OUT [PAIRS]}
OUT=${2:?usage: gpu_ab.sh OLD_DIR OUT [PAIRS]}
PAIRS=${3:-2}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=0
export AUTOANNOT_NATIVE_DIR=${AUTOANNOT_NATIVE_DIR:-/tmp/autoannot-native}
export WORLD=${WORLD:-1} ROUNDS=${ROUNDS:-6} PROCESS_ROUNDS=${PROCESS_ROUNDS:-1} PYTHONPATH=.
NEW=$(pwd)
START=$SECONDS DEADLINE=${DEADLINE:-520} GRAPH_PAIRS=${GRAPH_PAIRS:-0}
rm -rf "$OLD/benchmarks" && cp -r "$NEW/benchmarks" "$OLD/benchmarks"
for version in old new; do
  dir=$NEW; [ $version = old ] && dir=$OLD
  (cd "$dir" && python -m autoannot build-native >"$OUT/build_$version.log" 2>&1) ||
    { echo "$version: the native build failed (see $OUT/build_$version.log)"; exit 1; }
done
alternate() {  # SCRIPT PREFIX PAIRS
  for pair in $(seq "$3"); do
    for version in old new; do
      dir=$NEW; [ $version = old ] && dir=$OLD
      if (( SECONDS - START > DEADLINE )); then echo "deadline: $1 $version $pair not run"; return; fi
      (cd "$dir" && timeout 150 python "benchmarks/$1" "$OUT/$2${version}_$pair.json" \
        >"$OUT/$2${version}_$pair.log" 2>&1)
      echo "$2$version $pair: exit $? ($((SECONDS - START)) s)"
    done
  done
}
alternate gpu_capture.py "" "$PAIRS"
alternate gpu_graph.py graph_ "$GRAPH_PAIRS"
python - "$OUT" <<'EOF'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {}
for path in sorted(out.glob("graph_*.json")):
    s = json.loads(path.read_text())
    runs[path.stem] = {k: v for k, v in s.items() if k not in ("samples", "first_capture_samples")}
    print(f"{path.stem:14} capture on/off {s['capture_on_over_off']:.3f} "
          f"({s['capture_ms_off']:.2f} -> {s['capture_ms_on']:.2f} ms); replay "
          f"{s['replay_us_off']:.2f} -> {s['replay_us_on']:.2f} us; first capture added "
          f"{s['first_capture_added_ms']:.2f} ms")
for path in sorted(out.glob("[on]*_*.json")):
    summary = json.loads(path.read_text())["summary"]
    runs[path.stem] = summary
    cells = []
    for workload in summary:  # WORKLOADS=ddp runs one
        rounds = summary[workload]["later_capture_on_over_off_per_round"]
        cells.append(f"{workload} {statistics.median(rounds):.3f} "
                     f"(pooled {summary[workload]['later_capture_on_over_off']:.3f})")
    print(f"{path.stem:8} later captures, on over off, per round median: " + "; ".join(cells))
(out / "ab_summary.json").write_text(json.dumps(runs, indent=1))
EOF

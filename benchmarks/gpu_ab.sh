#!/usr/bin/env bash
# Two versions of the agent on one GPU machine, in alternating processes: what a change did to
# the capture benchmark, free of the drift between machines and sessions (an agent-off decoder
# set has ranged 15-44 ms across processes of one run).
#
#     git archive OLD_COMMIT | (mkdir -p ab_old && tar -x -C ab_old)   # here, before carrying
#     bash benchmarks/gpu_ab.sh ab_old OUT [PAIRS]
#
# Builds the native observer of each version, then runs benchmarks/gpu_capture.py PAIRS times
# (default 2) for each, old and new alternating (ROUNDS=6, PROCESS_ROUNDS=1, WORLD=1 unless
# set), and prints each run's decoder and DDP figures (per round medians) side by side.
set -u
OLD=${1:?usage: gpu_ab.sh OLD_DIR OUT [PAIRS]}
OUT=${2:?usage: gpu_ab.sh OLD_DIR OUT [PAIRS]}
PAIRS=${3:-2}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=0
export AUTOANNOT_NATIVE_DIR=${AUTOANNOT_NATIVE_DIR:-/tmp/autoannot-native}
export WORLD=${WORLD:-1} ROUNDS=${ROUNDS:-6} PROCESS_ROUNDS=${PROCESS_ROUNDS:-1} PYTHONPATH=.
NEW=$(pwd)
for version in old new; do
  dir=$NEW; [ $version = old ] && dir=$OLD
  (cd "$dir" && python -m autoannot build-native >"$OUT/build_$version.log" 2>&1) ||
    { echo "$version: the native build failed (see $OUT/build_$version.log)"; exit 1; }
done
for pair in $(seq "$PAIRS"); do
  for version in old new; do
    dir=$NEW; [ $version = old ] && dir=$OLD
    (cd "$dir" && timeout 150 python benchmarks/gpu_capture.py "$OUT/${version}_$pair.json" \
      >"$OUT/${version}_$pair.log" 2>&1)
    echo "$version $pair: exit $?"
  done
done
python - "$OUT" <<'EOF'
import json, statistics, sys
from pathlib import Path

for path in sorted(Path(sys.argv[1]).glob("*_*.json")):
    summary = json.loads(path.read_text())["summary"]
    cells = []
    for workload in ("inference", "ddp"):
        rounds = summary[workload]["later_capture_on_over_off_per_round"]
        cells.append(f"{workload} {statistics.median(rounds):.3f} "
                     f"(pooled {summary[workload]['later_capture_on_over_off']:.3f})")
    print(f"{path.stem:8} later captures, on over off, per round median: " + "; ".join(cells))
EOF

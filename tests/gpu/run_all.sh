#!/usr/bin/env bash
# Every GPU check and the GPU benchmark in one go; results packed into OUT/results.tgz (traces
# trimmed for committing under tests/data/gpu/). The steps of two ranks need 2 GPUs; on one,
# run STEPS="native observer_checks symm_mem" and the benchmarks with WORLD=1.
#
#     bash tests/gpu/run_all.sh OUT
#
# Each step runs in its own processes under a time limit (a hang costs that step only) and
# prints how long it took; steps that would end after DEADLINE seconds (default 540) are
# skipped, most needed first. STEPS (default "native observer_checks symm_mem patterns
# gpu_graph gpu_capture graph_replay compile_graphs footprint"; native: build the native observer first,
# NATIVE=0: run without it) and
# PATTERNS_TO_RUN choose a part. The exit status is the number of steps that failed or skipped.
set -u
OUT=${1:?usage: run_all.sh OUT}
mkdir -p "$OUT/patterns" "$OUT/graphs" "$OUT/compile" "$OUT/footprint"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=0
export PYTHONUNBUFFERED=1
DEADLINE=${DEADLINE:-540}
failed=0

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2 started=$SECONDS
  shift 2
  local left=$((DEADLINE - SECONDS - 20))  # 20 s kept for packing
  [ "$limit" -le "$left" ] || limit=$left
  if [ "$limit" -lt 30 ]; then
    echo "== $name: skipped (deadline)" | tee -a "$OUT/steps.txt"; failed=$((failed + 1)); return
  fi
  echo "== $name (limit ${limit}s)"
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] && grep -q EADDRINUSE "$OUT/$name.log"; then  # the free port was taken
    echo "== $name: port taken, once more"
    timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
  fi
  echo "== $name: exit $rc after $((SECONDS - started))s" | tee -a "$OUT/steps.txt"
  tail -n 5 "$OUT/$name.log"
  [ $rc -eq 0 ] || failed=$((failed + 1))
}

want() { [[ " ${STEPS:-native observer_checks symm_mem patterns gpu_graph gpu_capture graph_replay compile_graphs footprint} " == *" $1 "* ]]; }

# The native observer, built first (every later step then runs with it: launches below the
# Python API seen through torch's RecordFunction callbacks, captured ones noted in C++);
# NATIVE=0 runs everything on the Python layer.
export AUTOANNOT_NATIVE_DIR=${AUTOANNOT_NATIVE_DIR:-/tmp/autoannot-native}
if [ "${NATIVE:-1}" = 0 ]; then
  export AUTOANNOT_NATIVE=0
elif want native; then
  step native_build 120 env PYTHONPATH=. python -m autoannot build-native
fi

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python -c "import torch, wrapt; print('torch', torch.__version__, 'nccl',
  '.'.join(map(str, torch.cuda.nccl.version())), 'wrapt', wrapt.__version__)" | tee -a "$OUT/device.txt"
PYTHONPATH=. python -m autoannot doctor 2>/dev/null | grep "native observer" | tee -a "$OUT/device.txt"
if want observer_checks; then  # one GPU: the ledger against torch's record_param_comms
  mkdir -p "$OUT/observer"
  step observer_checks 120 env AUTOANNOT=1 PYTHONPATH=autoannot/_hook:. \
    python tests/gpu/observer_checks.py "$OUT/observer/checks_${NATIVE_NAME:-native}.json"
  step observer_checks_python 120 env AUTOANNOT=1 AUTOANNOT_NATIVE=0 \
    PYTHONPATH=autoannot/_hook:. python tests/gpu/observer_checks.py "$OUT/observer/checks_python.json"
fi
if want symm_mem; then  # one GPU: symmetric-memory collectives, eager and graphed
  step symm_mem 120 env AUTOANNOT=1 PYTHONPATH=autoannot/_hook:. \
    python tests/gpu/symm_mem.py "$OUT/symm_mem"
fi
if want patterns; then
  for pattern in ${PATTERNS_TO_RUN:-ddp graphed compiled mixed threads inference}; do
    step "pattern_$pattern" 120 env PATTERNS=$pattern DUMP_AFTER=110 \
      AUTOANNOT=1 PYTHONPATH=autoannot/_hook:. python tests/gpu/training_patterns.py "$OUT/patterns"
  done
  step patterns_verify 60 env PYTHONPATH=. python tests/gpu/training_patterns.py verify "$OUT/patterns"
  cp "$OUT/patterns_verify.log" "$OUT/patterns/run_output.txt"
fi
want gpu_graph && step gpu_graph 200 env PYTHONPATH=. python benchmarks/gpu_graph.py "$OUT/results_gpu_graph.json"
want gpu_capture && step gpu_capture 240 env PYTHONPATH=. python benchmarks/gpu_capture.py "$OUT/results_gpu_capture.json"
want graph_replay && step graph_replay 120 env AUTOANNOT=1 PYTHONPATH=autoannot/_hook:. python tests/gpu/graph_replay.py "$OUT/graphs"
want compile_graphs && step compile_graphs 180 env AUTOANNOT=1 PYTHONPATH=autoannot/_hook:. python tests/gpu/compile_graphs.py "$OUT/compile"
want gpu_times && step gpu_times 240 env PYTHONPATH=. python tests/gpu/gpu_times.py "$OUT/times"
want gpu_decode && step gpu_decode 200 env PYTHONPATH=. python benchmarks/gpu_decode.py "$OUT/results_gpu_decode.json"
want footprint && step footprint 150 env PYTHONPATH=. python tests/gpu/footprint.py "$OUT/footprint"
PYTHONPATH=. python tests/gpu/pack.py "$OUT" "$OUT/results.tgz" && \
  find "$OUT" -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name steps.txt -exec rm -rf {} +
cat "$OUT/steps.txt"
exit $failed

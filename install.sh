#!/bin/sh
# Install autoannot and its test tools into the current Python environment.
# Where no torch is installed yet, take the CPU wheel of torch 2.13.0 first: a bare "torch"
# requirement would make pip pull a CUDA build of several GB.
set -eu
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "install.sh: no torch here; installing the CPU wheel torch==2.13.0"
    "$PYTHON" -m pip install "torch==2.13.0"
fi
"$PYTHON" -m pip install -e ".[test]"
# HolisticTraceAnalysis reads our traces in the tests; its wheel asks for jupyterlab (notebooks
# only, a large install): take it without, its runtime needs come with ".[test]".
"$PYTHON" -m pip install --no-deps "HolisticTraceAnalysis==0.5.0"

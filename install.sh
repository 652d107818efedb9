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

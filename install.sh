#!/bin/sh
# Install autoannot into the current Python environment ($PYTHON, default python3).
#
#   ./install.sh             autoannot (editable) and the tools its tests read traces with
#   ./install.sh --agent     autoannot alone (it needs torch>=2.6 and wrapt)
#   ./install.sh --dry-run   print the pip commands instead of running them
#
# Where no torch is installed yet, torch==2.13.0 is installed first (the release the suite runs
# on): from $TORCH_INDEX_URL when it is set (PyTorch's CPU-only builds come from its CPU index,
# https://download.pytorch.org/whl/cpu), otherwise from pip's own configuration. On Linux,
# PyPI's torch is the CUDA build: several GB, with NVIDIA's libraries. An installed torch is
# never replaced.
set -eu
PYTHON=${PYTHON:-python3}
agent_only=no
dry_run=no
for argument in "$@"; do
    case "$argument" in
        --agent) agent_only=yes ;;
        --dry-run) dry_run=yes ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown option $argument (see ./install.sh --help)" >&2; exit 2 ;;
    esac
done

run() {
    echo "+ $*"
    [ "$dry_run" = yes ] || "$@"
}

if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        echo "install.sh: no torch here; torch==2.13.0 from $TORCH_INDEX_URL"
        run "$PYTHON" -m pip install "torch==2.13.0" --index-url "$TORCH_INDEX_URL"
    else
        echo "install.sh: no torch here; torch==2.13.0 from pip's configuration (on Linux, PyPI"
        echo "  gives the CUDA build, several GB; set TORCH_INDEX_URL for PyTorch's CPU build)"
        run "$PYTHON" -m pip install "torch==2.13.0"
    fi
    [ "$dry_run" = yes ] || "$PYTHON" -c "import torch; print('install.sh: torch', torch.__version__, '(CUDA ' + torch.version.cuda + ' build)' if torch.version.cuda else '(CPU build)')"
fi
if [ "$agent_only" = yes ]; then
    run "$PYTHON" -m pip install -e .
    exit 0
fi
run "$PYTHON" -m pip install -e ".[test]"
# HolisticTraceAnalysis reads our traces in the tests; its wheel asks for jupyterlab (notebooks
# only, a large install): take it without, its runtime needs come with ".[test]".
run "$PYTHON" -m pip install --no-deps "HolisticTraceAnalysis==0.5.0"

"""The README's main command: the example runs on the CPU and prints what the agent attached."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[1] / "examples" / "tensor_parallel.py"


@pytest.mark.parametrize("layer", ["python layer", "native observer", "group hooks"])
def test_example_prints_the_annotations_of_every_collective(layer: str, request) -> None:
    """With each observer below the Python API: the backward's all-gather (a C++-origin
    launch on gloo, which makes no record of it) is in the record file too."""
    from autoannot.observe import group_hooks

    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOANNOT")}
    env["AUTOANNOT"] = "1"
    env["AUTOANNOT_GROUP_HOOKS"] = "1" if layer == "group hooks" else "0"
    if layer == "group hooks" and not group_hooks.available():
        pytest.skip("this torch's process groups take no collective hooks (torch < 2.14)")
    if layer == "native observer":
        env["AUTOANNOT_NATIVE_DIR"] = str(request.getfixturevalue("native_build").parents[1])
    else:
        env["AUTOANNOT_NATIVE"] = "0"
    done = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for rank in (0, 1):
        assert f"rank {rank}: 6 collectives annotated" in lines
    apis = [line.split()[0] for line in lines if line.startswith("  ")]
    # the backward of the reduce-scatter is an all-gather, launched by autograd from C++
    assert apis == 2 * ["broadcast", "funcol.all_gather_tensor_autograd",
                        "funcol.reduce_scatter_tensor_autograd",
                        "_c10d_functional.all_gather_into_tensor", "all_reduce", "barrier"]
    assert '"Process Group Description": "tp"' in done.stdout


def test_example_asks_the_agent_not_the_variable_whether_it_ran() -> None:
    """``AUTOANNOT=no`` turns the agent off (its own reading of the flag): the example says it
    ran without it, rather than "0 collectives annotated"."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOANNOT")}
    env["AUTOANNOT"] = "no"
    done = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "Ran without the agent" in done.stdout
    assert "collectives annotated" not in done.stdout

"""Launches no Python proxy sees — DDP's reducer, autograd, direct ``ProcessGroup`` calls —
annotated by the kernels on the ``c10d::`` ops, once each, with the eager vocabulary.

Real gloo groups (2 and 4 ranks). The oracle for "one record per launched collective" is
torch's profiler: gloo opens one ``gloo:<collective>`` range per launch.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import agent_hooks as hooks
import pytest
import scenarios
from harness import run_ranks

from autoannot.describe import vocabulary as V


def _gloo_title(name: str) -> str:
    for title, names in scenarios.GLOO_TITLES.items():
        if name in names:
            return title
    return f"<no gloo title for {name}>"


@pytest.fixture(scope="module")
def ddp_runs() -> dict[int, list[dict[str, Any]]]:
    two = run_ranks(scenarios.ddp_training, 2,
                    args=([n for n in scenarios.DDP_CONFIGS if n != "subgroup"],))
    four = run_ranks(scenarios.ddp_training, 4, args=(["buckets", "subgroup"],))
    return {2: two, 4: four}


CASES = [(2, name) for name in scenarios.DDP_CONFIGS if name != "subgroup"]
CASES += [(4, "buckets"), (4, "subgroup")]


@pytest.mark.parametrize(("world", "name"), CASES)
def test_ddp_launches_are_each_recorded_once_with_the_eager_fields(ddp_runs, world: int,
                                                                   name: str) -> None:
    for rank, run in enumerate(ddp_runs[world]):
        result = run[name]
        records, gloo = result["records"], result["gloo"]
        # exactly one record per launched collective: the same collectives gloo ran
        assert Counter(_gloo_title(r["annotation"][V.COLLECTIVE_NAME]) for r in records) == (
            Counter(gloo)), (rank, [r["api"] for r in records], gloo)
        group = result["group"]
        for r in records:
            annotation = r["annotation"]
            assert list(annotation)[:7] == list(V.KERNEL_KEYS[:7])
            assert annotation[V.GROUP_SIZE] == group["size"]
            assert annotation[V.PG_NAME] == group["name"]
            assert annotation[V.NAME] == r["api"] and annotation[V.STREAM] >= V.FIRST_LANE
            assert r["call_site"].endswith(".py:" + r["call_site"].rsplit(":", 1)[-1])
            assert "scenarios.py" in r["call_site"]  # the user's line: DDP(...) or backward()
        # the last step's gradient all-reduces are DDP's buckets, in its dtype (its other
        # collectives, if any, are broadcasts of DDP's bucket rebuild)
        last = [r["annotation"] for r in result["steps"][-1]
                if r["annotation"][V.COLLECTIVE_NAME] == "allreduce"]
        assert {r["annotation"][V.COLLECTIVE_NAME] for r in result["steps"][-1]} <= {
            "allreduce", "broadcast"}
        assert sorted(a[V.IN_NELEMS] for a in last) == sorted(result["buckets"])
        dtype = "Half" if name == "fp16_hook" else "Float"
        assert {a[V.DTYPE] for a in last} == {dtype}
        apis = {r["api"] for r in result["steps"][-1]
                if r["annotation"][V.COLLECTIVE_NAME] == "allreduce"}
        assert apis == ({"all_reduce"} if name == "fp16_hook" else {"c10d.allreduce_"})
        if name == "no_sync":  # accumulation steps reduce nothing (the first rebuilds buckets)
            assert [[r["annotation"][V.COLLECTIVE_NAME] for r in step]
                    for step in result["steps"][1:3]] == [["broadcast", "broadcast"], []]


def test_ddp_figures(ddp_runs, figures) -> None:
    recorded = launched = 0
    for runs in ddp_runs.values():
        for run in runs:
            for result in run.values():
                recorded += len(result["records"])
                launched += len(result["gloo"])
    figures["DDP on gloo (2 and 4 ranks, 6 configurations): records / launched collectives"] = (
        f"{recorded}/{launched}")
    assert recorded == launched


def test_a_launch_from_cpp_with_no_python_caller_says_so() -> None:
    """On autograd's engine threads (DDP's reducer on CUDA) no Python frame calls the
    collective: the call site says so instead of naming a frame of torch or of the agent."""
    import _thread
    import time

    from autoannot.describe import sites

    found: list[str] = []
    # A thread whose only Python frame is the agent's own (map/extend are C): as on autograd's.
    _thread.start_new_thread(found.extend, (map(sites.call_site, [0]),))
    deadline = time.monotonic() + 10
    while not found and time.monotonic() < deadline:
        time.sleep(0.01)
    assert found == [sites.NO_PYTHON_CALLER]
    assert sites.call_site(1).rsplit(":", 1)[0] == __file__  # a Python caller: its line


OPS_OFF_SCRIPT = """
import torch, torch.distributed as dist
import autoannot
from torch.testing._internal.distributed.fake_pg import FakeStore
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
ops = torch.ops._c10d_functional
key = torch._C._dispatch_key_parse("DeferredInit")
with autoannot.record(dispatcher=True) as records:
    dist.all_reduce(torch.ones(2))
    dist.group.WORLD.allreduce([torch.ones(3)]).wait()
    ops.wait_tensor(ops.all_reduce(torch.ones(4), "sum", "0"))
    ours = ("c10d::allreduce_", "_c10d_functional::all_reduce")
    kernels = [torch._C._dispatch_has_kernel_for_dispatch_key(op, "DeferredInit") for op in ours]
    touched = (torch._C._dispatch_tls_is_dispatch_key_included(key),
               torch._C._dispatch_has_backend_fallback(key))
print([r.api for r in records], kernels, touched)
"""


@pytest.mark.parametrize("ops", ["1", "0"])
def test_autoannot_ops_0_puts_nothing_on_the_dispatcher(ops: str, tmp_path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "AUTOANNOT": "1", "AUTOANNOT_OPS": ops}
    done = subprocess.run([sys.executable, "-c", OPS_OFF_SCRIPT], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    if ops == "0":  # only the proxies: the C++-origin and compiled-code launches go unseen
        assert last == "['all_reduce'] [False, False] (False, False)"
    elif hooks.group_hooks_observe():  # torch's process-group hooks: nothing on the dispatcher
        assert last == ("['all_reduce', 'c10d.allreduce_', '_c10d_functional.all_reduce'] "
                        "[False, False] (False, False)")
    else:
        assert last == ("['all_reduce', 'c10d.allreduce_', '_c10d_functional.all_reduce'] "
                        "[True, True] (True, True)")

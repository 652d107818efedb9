"""The proxies across the wrapt releases autoannot allows (``wrapt>=1.16,<3``), each as its C
extension and as its pure-Python build (``WRAPT_DISABLE_EXTENSIONS=1``).

A proxy of an unbound function skips wrapt's per-call ``__self__`` lookup by re-initialising
wrapt's base class with an instance of its own (``proxies.UNBOUND``): wrapt's private
``__init__`` argument order and ``_self_binding``. Each release is installed into a temporary
folder (pip's cache left alone) and a real 1-rank gloo job is run on it: the collective is
annotated, the fast path is taken, no warning is given, and ``disable()`` restores the
original by identity.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RELEASES = ("1.16.0", "1.17.3", "2.1.2", "2.5.2")

JOB = r"""
import json, os, sys, tempfile, warnings
warnings.simplefilter("error")  # (any warning of the agent's fails the job)
import wrapt
import torch, torch.distributed as dist
import autoannot
from autoannot.agent import proxies

original = dist.all_reduce
autoannot.enable()
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
proxy = dist.all_reduce
with autoannot.record() as records:
    dist.all_reduce(torch.ones(5))
base = wrapt.FunctionWrapper.__mro__[1]
out = {
    "wrapt": wrapt.__version__,
    "c_extension": type(base) is type,  # (pure Python: wrapt's own metaclass)
    "proxied": isinstance(proxy, proxies.CollectiveProxy),
    "fast_path": proxy._self_instance is proxies.UNBOUND,
    "records": [(r.api, r.annotation["Collective name"], r.annotation["In msg nelems"])
                for r in records],
}
dist.destroy_process_group()
autoannot.disable()
out["restored"] = dist.all_reduce is original
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def wrapt_releases(tmp_path_factory) -> dict[str, Path]:
    """release -> a folder holding it alone (``pip install --target``, no cache)."""
    folders = {}
    for release in RELEASES:
        target = tmp_path_factory.mktemp(f"wrapt-{release}")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-cache-dir",
             "--target", str(target), f"wrapt=={release}"],
            capture_output=True, text=True, timeout=600)
        if done.returncode:
            pytest.skip(f"pip cannot install wrapt {release} here: {done.stderr[-500:]}")
        folders[release] = target
    return folders


@pytest.mark.parametrize("build", ["C extension", "pure Python"])
@pytest.mark.parametrize("release", RELEASES)
def test_the_proxies_on_every_wrapt_release(wrapt_releases, release: str, build: str,
                                            tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOANNOT")}
    env["PYTHONPATH"] = os.pathsep.join([str(wrapt_releases[release]), str(ROOT)])
    env.pop("WRAPT_DISABLE_EXTENSIONS", None)  # (wrapt reads any value as "disable")
    if build == "pure Python":
        env["WRAPT_DISABLE_EXTENSIONS"] = "1"
    env["HOME"] = str(tmp_path)  # (nothing of the job's under the user's home)
    done = subprocess.run([sys.executable, "-c", JOB], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["wrapt"] == release
    assert got["c_extension"] is (build == "C extension")
    assert got["proxied"] and got["fast_path"] and got["restored"]
    assert got["records"] == [["all_reduce", "allreduce", 5]]

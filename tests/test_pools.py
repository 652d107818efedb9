"""The command's pools (``parallel.prepare_workers``): their processes start with glibc's
allocator set to keep freed memory, and nothing else the command starts sees it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import json, multiprocessing, os, subprocess, sys
from autoannot.traces import parallel

def environment(_):
    return os.environ.get("GLIBC_TUNABLES")

if __name__ == "__main__":
    parallel.prepare_workers()
    context = multiprocessing.get_context("forkserver")
    with parallel.pool(2, context) as workers:
        in_workers = list(workers.map(environment, range(4)))
    started = subprocess.run([sys.executable, "-c",
                              "import os; print(os.environ.get('GLIBC_TUNABLES'))"],
                             capture_output=True, text=True).stdout.strip()
    print(json.dumps({"workers": in_workers, "command": os.environ.get("GLIBC_TUNABLES"),
                      "started": started}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's variable: Linux")
@pytest.mark.parametrize("users", [None, "glibc.malloc.arena_max=2"])
def test_the_allocator_setting_reaches_the_pool_alone(tmp_path: Path, users: str | None) -> None:
    script = tmp_path / "pools.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if users:
        env["GLIBC_TUNABLES"] = users
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    from autoannot.traces.parallel import WORKERS_ALLOCATOR

    if users:  # (a user's own setting everywhere, as they set it)
        assert found == {"workers": [users] * 4, "command": users, "started": users}
    else:
        assert found == {"workers": [WORKERS_ALLOCATOR] * 4, "command": None,
                         "started": "None"}

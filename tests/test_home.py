"""Issue 38: the suite leaves the user's machine as it found it. A run of tests that build the
native observer, draw with matplotlib and read traces, under a fresh home: nothing of
autoannot's (nor matplotlib's) lands in it — builds go to the run's temporary folder
(``conftest.py``), never ``~/.cache/autoannot/native``, where later real jobs would find them;
and that folder goes when the run ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_test_run_writes_nothing_into_the_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AUTOANNOT", "XDG_", "MPLCONFIGDIR", "PYTEST_"))}
    env["HOME"] = str(home)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env["TMPDIR"] = str(scratch)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         "tests/test_native.py::test_call_claimed_returns_raises_and_claims_only_during_the_call",
         "tests/test_tools.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "passed" in done.stdout
    left = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert left == [], left
    # The run's own temporary folders (no native observer; matplotlib's home) go with it.
    run_folders = sorted(p.name for p in scratch.iterdir() if p.name.startswith("autoannot-"))
    assert run_folders == [], run_folders

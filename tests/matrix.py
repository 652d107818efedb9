"""Run the test suite on several torch releases, each in a virtual environment of its own.

    python tests/matrix.py                       # 2.6.0 2.9.1 2.13.0 2.14.1 2.15.0
    python tests/matrix.py 2.14.1 2.15.0 -- -k golden
    python tests/matrix.py --setup-only          # create and install the environments only

Environments live in ``.matrix/torch-<version>`` (reused when they hold that torch). pip's
local cap on torch releases (``/etc/xdg/pip``) is lifted for these installs only
(``PIP_CONSTRAINT=/dev/null``; an empty value does not lift it); releases not on this disk come
from the registry (CUDA builds: a few GB each). Prints a table of pytest's counts per release,
and the reasons of every skip; exits 1 if any release has a failure or an error.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASES = ("2.6.0", "2.9.1", "2.13.0", "2.14.1", "2.15.0")
FAILURE_LINES = 30  # of each failure's traceback, printed under the table


def _venv(release: str) -> Path:
    return ROOT / ".matrix" / f"torch-{release}"


def _python(release: str) -> Path:
    return _venv(release) / "bin" / "python"


def _installed_torch(release: str) -> str | None:
    python = _python(release)
    if not python.exists():
        return None
    done = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def setup(release: str, log: Path) -> None:
    """A venv holding torch ``release`` and autoannot (editable) with its test tools."""
    found = _installed_torch(release)
    if found is not None and found.split("+")[0] == release:
        print(f"torch {release}: environment ready ({found})", file=sys.stderr)
        return
    print(f"torch {release}: creating {_venv(release)} (log: {log})", file=sys.stderr)
    env = {**os.environ, "PIP_CONSTRAINT": "/dev/null", "PYTHON": str(_python(release))}
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(_venv(release))],
        [str(_python(release)), "-m", "pip", "install", "-q", f"torch=={release}"],
        ["sh", str(ROOT / "install.sh")],
    ]
    with log.open("a") as out:
        for step in steps:
            out.write(f"$ {' '.join(step)}\n")
            out.flush()
            subprocess.run(step, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                           check=True)


def run(release: str, pytest_args: list[str], log: Path) -> dict[str, object]:
    """The suite in that environment; pytest's counts and skip reasons."""
    report = log.with_suffix(".xml")
    report.unlink(missing_ok=True)  # (a run that dies writes none: never an earlier run's)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOANNOT")}
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run([str(_python(release)), "-m", "pytest", "-q", "-rs",
                               "-p", "no:cacheprovider", f"--junitxml={report}",
                               *pytest_args], cwd=ROOT, env=env, stdout=out,
                              stderr=subprocess.STDOUT)
    counts: dict[str, object] = {"release": release, "torch": _installed_torch(release),
                                 "exit": done.returncode,
                                 "minutes": round((time.monotonic() - started) / 60, 1)}
    if report.exists():
        suite = ET.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        total = int(suite.get("tests", 0))
        failed, errors = int(suite.get("failures", 0)), int(suite.get("errors", 0))
        skipped = int(suite.get("skipped", 0))
        counts.update(passed=total - failed - errors - skipped, failed=failed, errors=errors,
                      skipped=skipped)
        reasons = {}
        for case in suite.iter("testcase"):
            skip = case.find("skipped")
            if skip is not None:
                reason = re.sub(r"^Skipped: ", "", skip.get("message", ""))
                reasons[reason] = reasons.get(reason, 0) + 1
        counts["skip_reasons"] = reasons
        counts["failures"] = [_failure(case) for case in suite.iter("testcase")
                              if case.find("failure") is not None
                              or case.find("error") is not None]
    return counts


def _failure(case: ET.Element) -> str:
    """A failed test's id and the last lines of what it raised (CI shows only this table)."""
    name = f"{case.get('classname', '')}::{case.get('name', '')}"
    found = case.find("failure")
    found = case.find("error") if found is None else found
    text = (found.text or found.get("message", "")).strip().splitlines()
    return "\n".join([name, *("      " + line for line in text[-FAILURE_LINES:])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("releases", nargs="*", default=list(RELEASES), help="torch releases")
    parser.add_argument("--setup-only", action="store_true", help="install, run nothing")
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:  # what follows goes to pytest (not taken for releases)
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args += extra
    logs = ROOT / ".matrix" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    results = []
    for n, release in enumerate(args.releases, 1):
        log = logs / f"torch-{release}.log"
        print(f"[{n}/{len(args.releases)}] torch {release}", file=sys.stderr)
        try:
            setup(release, log)
        except subprocess.CalledProcessError as exc:
            results.append({"release": release, "exit": "setup failed",
                            "error": f"{exc} (see {log})"})
            continue
        if not args.setup_only:
            results.append(run(release, pytest_args, log))
    if args.setup_only:
        return 0 if all("error" not in r for r in results) else 1
    print(f"{'torch':16} {'passed':>7} {'failed':>7} {'errors':>7} {'skipped':>8} {'min':>5}")
    for r in results:
        if "error" in r:
            print(f"{r['release']:16} setup failed: {r['error']}")
            continue
        print(f"{r['torch']!s:16} {r.get('passed', '?'):>7} {r.get('failed', '?'):>7} "
              f"{r.get('errors', '?'):>7} {r.get('skipped', '?'):>8} {r['minutes']:>5}")
        for reason, count in sorted(r.get("skip_reasons", {}).items()):
            print(f"    skipped {count}: {reason}")
        if r.get("failed") or r.get("errors") or r.get("exit") not in (0,):
            log = logs / f"torch-{r['release']}.log"  # pytest's summary of what failed
            for line in log.read_text(errors="replace").splitlines():
                if " passed" in line or "Fatal Python error" in line:
                    print(f"    {line}")
            for failure in r.get("failures", []):
                print(f"    FAILED {failure}")
            if "passed" not in r:
                print(f"    pytest exited {r['exit']} with no report: it died (see {log})")
    bad = [r for r in results if "error" in r or r.get("failed") or r.get("errors")
           or r.get("exit") not in (0,)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

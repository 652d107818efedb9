"""The matrix runner's report: CI shows only its table, so a failure must name itself there
(before, a failed test on torch 2.14.1 printed as a count, its name only in a log CI keeps)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import matrix


def test_a_failed_test_is_named_with_the_end_of_its_traceback(tmp_path) -> None:
    (tmp_path / "test_planted.py").write_text(
        "def test_fine():\n    pass\n\n"
        "def test_planted_failure():\n    assert 40 + 2 == 41, 'planted'\n")
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={report}", str(tmp_path / "test_planted.py")],
                   cwd=tmp_path, capture_output=True, timeout=120)
    cases = {case.get("name"): case for case in ET.parse(report).getroot().iter("testcase")}
    said = matrix._failure(cases["test_planted_failure"])
    assert said.splitlines()[0] == "test_planted::test_planted_failure"
    assert "AssertionError: planted" in said
    assert len(said.splitlines()) <= 1 + matrix.FAILURE_LINES

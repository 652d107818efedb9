"""Repository-wide pytest set-up: figures the tests measure are printed in the summary."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests"))

FIGURES: dict[str, str] = {}


@pytest.fixture(scope="session")
def figures() -> dict[str, str]:
    """Tests put the counts they establish here; they are printed at the end of the run."""
    return FIGURES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("autoannot figures")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")

"""pytest plugin (registered through the ``pytest11`` entry point).

Fixtures:
    ``autoannot_records``: the agent on for the test; yields the live list of its Records.
    ``autoannot_off``: the agent guaranteed off for the test.
Option ``--autoannot`` (or ``AUTOANNOT=1``) turns it on for the whole session. Whatever a test
does, the state before it (on or off, the original objects) is restored after it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from autoannot.agent import instrumentation
from autoannot.recorder import Recording, record


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--autoannot", action="store_true", default=False,
                     help="instrument torch.distributed collectives for the whole session")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--autoannot", default=False):
        instrumentation.enable()


def _restore(was_enabled: bool) -> None:
    if was_enabled:
        instrumentation.enable()
    else:
        instrumentation.disable()


@pytest.fixture
def autoannot_records() -> Iterator[Recording]:
    """Enable the agent for this test and yield the records of the collectives it launches,
    from the Python API and below it (``record()``: DDP's reducer, compiled code, ``pg.*``)."""
    was_enabled = instrumentation.is_enabled()
    instrumentation.enable()
    try:
        with record() as records:
            yield records
    finally:
        _restore(was_enabled)


@pytest.fixture
def autoannot_off() -> Iterator[None]:
    """Guarantee the agent is off (originals in place) for this test."""
    was_enabled = instrumentation.is_enabled()
    instrumentation.disable()
    try:
        yield
    finally:
        _restore(was_enabled)

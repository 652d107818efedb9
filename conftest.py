"""Repository-wide pytest set-up: figures the tests measure are printed in the summary."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests"))

FIGURES: dict[str, str] = {}
_RUN_FOLDERS: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """No native observer unless a test asks for one (``native_build``): a module built for
    this source under the user's cache would otherwise change which layer every test runs
    (the tests of the Python layer among them)."""
    import os
    import tempfile

    os.environ["AUTOANNOT_NATIVE_DIR"] = tempfile.mkdtemp(prefix="autoannot-no-native-")
    _RUN_FOLDERS.append(os.environ["AUTOANNOT_NATIVE_DIR"])
    # Nothing in the user's home: matplotlib's font cache and config, and what the browser
    # the page tests open keeps (dconf, crash reports), go to this run's temporary folder
    # (the variables reach every process the tests start).
    home = tempfile.mkdtemp(prefix="autoannot-test-home-")
    _RUN_FOLDERS.append(home)
    for variable, name in (("MPLCONFIGDIR", "matplotlib"), ("XDG_CACHE_HOME", "cache"),
                           ("XDG_CONFIG_HOME", "config")):
        os.environ[variable] = os.path.join(home, name)
    # A run started in the background by a script (``cmd &`` with no job control) inherits
    # Ctrl-C ignored, and every command the tests start would inherit it too: the tests that
    # press Ctrl-C on one (SIGINT) would find it ignored (a watch that never ends) or pass
    # without it ever arriving. They get what a terminal gives: Python's handler here, the
    # default in what it starts.
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's temporary folders go with it."""
    import shutil

    while _RUN_FOLDERS:
        shutil.rmtree(_RUN_FOLDERS.pop(), ignore_errors=True)


@pytest.fixture(scope="session")
def figures() -> dict[str, str]:
    """Tests put the counts they establish here; they are printed at the end of the run."""
    return FIGURES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("autoannot figures")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")


@pytest.fixture(scope="session")
def fake_world():
    """This test process as rank 0 of a 2-rank ``fake`` process group (no peers, no data moved)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield dist.group.WORLD


@pytest.fixture
def agent():
    """The agent on for one test; off again (originals restored) after it."""
    import autoannot

    autoannot.enable()
    try:
        yield autoannot
    finally:
        autoannot.disable()


@pytest.fixture(autouse=True)
def _the_native_observer_where_built(request: pytest.FixtureRequest,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that builds the native observer runs it: on a torch whose process groups take
    hooks (the observer there), with them turned off."""
    if "native_build" in request.fixturenames:
        monkeypatch.setenv("AUTOANNOT_GROUP_HOOKS", "0")


@pytest.fixture(scope="session")
def native_build(tmp_path_factory: pytest.TempPathFactory):
    """The native observer compiled against this torch, once a session, in a folder of the
    run (``autoannot build-native``'s code); the path of the module (its folder's parent is
    the ``AUTOANNOT_NATIVE_DIR`` to use)."""
    from autoannot import native

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUTOANNOT_NATIVE_DIR", str(tmp_path_factory.mktemp("native")))
        return native.build()


@pytest.fixture(scope="module")
def monkeypatch_module():
    """``monkeypatch`` for a whole module."""
    with pytest.MonkeyPatch.context() as patch:
        yield patch


pytest_plugins = ["pytester"]


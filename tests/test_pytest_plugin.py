"""The pytest plugin: fixtures toggle the agent per test; --autoannot for a whole session."""

from __future__ import annotations

INNER = '''
import pytest, torch, torch.distributed as dist, wrapt
from torch.testing._internal.distributed.fake_pg import FakeStore

ORIGINAL = None

@pytest.fixture(scope="module", autouse=True)
def world():
    global ORIGINAL
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    ORIGINAL = dist.all_reduce if not isinstance(dist.all_reduce, wrapt.FunctionWrapper) \\
        else dist.all_reduce.__wrapped__
    yield
    dist.destroy_process_group()

def test_records(autoannot_records):
    dist.all_reduce(torch.ones(3))
    assert [r.api for r in autoannot_records] == ["all_reduce"]
    assert autoannot_records[0].annotation["In msg nelems"] == 3

def test_restored_after(request):
    import autoannot
    session_on = request.config.getoption("--autoannot")
    assert autoannot.is_enabled() == session_on
    assert (dist.all_reduce is ORIGINAL) != session_on

def test_off(autoannot_off):
    import autoannot
    assert not autoannot.is_enabled() and dist.all_reduce is ORIGINAL

def test_restored_after_off(request):
    import autoannot
    assert autoannot.is_enabled() == request.config.getoption("--autoannot")
'''


def test_fixtures_toggle_and_restore(pytester) -> None:
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=4)


def test_session_option_turns_the_agent_on(pytester) -> None:
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "--autoannot")
    result.assert_outcomes(passed=4)

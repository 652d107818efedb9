"""Run at interpreter start-up when AUTOANNOT is set (by ``autoannot-startup.pth`` or the
``sitecustomize`` of ``autoannot/_hook``): turn the agent on if its value says so (an unknown
value is reported and leaves it off), and open ``AUTOANNOT_RECORD``'s file. Imports neither
torch nor wrapt."""

from autoannot.base import config

if config.agent_requested():
    from autoannot.agent.instrumentation import INSTRUMENTATION

    INSTRUMENTATION.enable()
    if config.record_template() is not None:
        from autoannot.keep import journal

        journal.open_from_environment(INSTRUMENTATION.state)

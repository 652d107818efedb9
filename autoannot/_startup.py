"""Run at interpreter start-up when AUTOANNOT is set (by ``autoannot-startup.pth`` or the
``sitecustomize`` of ``autoannot/_hook``): turn the agent on if its value says so (an unknown
value is reported and leaves it off). Imports neither torch nor wrapt."""

import os

from autoannot import config

if config.agent_requested():
    from autoannot.patching import enable

    enable()
    if os.environ.get("AUTOANNOT_RECORD"):
        from autoannot.recorder import FileSink
        from autoannot.state import STATE

        STATE.open_recorder(FileSink(os.environ["AUTOANNOT_RECORD"]))

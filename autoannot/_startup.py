"""Run at interpreter start-up when AUTOANNOT is set (by ``autoannot-startup.pth`` or the
``sitecustomize`` of ``autoannot/_hook``): turn the agent on if its value says so (an unknown
value is reported and leaves it off), open ``AUTOANNOT_RECORD``'s file and ``AUTOANNOT_RING``'s
ring (its run's folder where only the watch asks for one), and with ``AUTOANNOT_WATCH``
watch the job from rank 0. Imports neither
torch nor wrapt."""

from autoannot.base import config

if config.agent_requested():
    from autoannot.agent.instrumentation import INSTRUMENTATION

    INSTRUMENTATION.enable()
    if config.record_template() is not None:
        from autoannot.keep import journal

        journal.open_from_environment(INSTRUMENTATION.state)
    if config.ring_wanted():
        from autoannot.keep import ring

        opened = ring.open_from_environment(INSTRUMENTATION.state)
        if opened is not None and config.watch_store_set():
            from autoannot.live import publish

            publish.start_from_environment(opened)
        if opened is not None and config.watch_requested():
            from autoannot.live import watch_thread

            watch_thread.start_on_rank_0(opened)

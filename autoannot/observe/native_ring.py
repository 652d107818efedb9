"""The Python API's launches written to the always-on ring in C: while one ring with files is
the only thing open, the native module's C wrapper of each proxy (``handoff_wrapper``) writes
a launch of a key and from a call site seen before through the ring writer, with no Python code
run; Python derives a new key's kind (the proxy's Python wrapper writes that launch) and tells
its ids once (``ids``)."""

from __future__ import annotations

from typing import Any

from autoannot.describe import groups, sites


class ProxiesRing:
    """Turns the C wrappers' ring path on and off as the agent's state changes, and attaches
    the ring they write to the native writer."""

    def __init__(self, module: Any) -> None:
        self.module = module
        module.set_site_resolver(sites.SITES, sites.site_from, sites.LIBRARY_FILES)
        groups.on_group_gone(module.forget_handed)  # (the C wrappers key by a group's id)

    def demand_changed(self, state: Any) -> None:
        """(``State`` listener, under its lock) On while one ring with files is open and
        nothing else: no capture, recorder or coalescing block."""
        self.module.set_proxies_ring(state.route.ring_alone, state.inside)

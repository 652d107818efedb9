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
        rings = state.rings
        alone = (state.live and rings is not None and len(rings) == 1
                 and rings[0].folder is not None and not state.captures
                 and not state.recorders and not state.blocks)
        self.module.set_proxies_ring(alone, state.inside)

    def ids(self, ring: Any, kind: Any) -> tuple[int, int] | None:
        """``ring``'s ids of the launch of ``kind`` just written to it (its kind's, its
        group's slot), once the native writer writes it (attached now if it can be); None
        where it does not."""
        if not ring.attach_writer(self.module):
            return None
        return ring.ids_of(kind)

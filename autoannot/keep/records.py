"""What a launch leaves for ``record()``'s recorders and the record file: a ``Record`` (the route,
``keep.route``, hands it to them)."""

from __future__ import annotations

from typing import Any, NamedTuple

from autoannot.describe import vocabulary as V


class Record(NamedTuple):
    """One collective launch seen by the agent."""

    api: str  # the function called, e.g. "all_reduce" or "funcol.all_gather_tensor"
    annotation: dict[str, Any]  # what the annotation context was given
    call_site: str  # "path.py:123": the first frame outside torch and autoannot
    cpu_only: dict[str, Any]  # "Rank", "Global rank start/stride": the CPU op's own keys

    @property
    def param_comms(self) -> dict[str, Any]:
        """The args of the eager CPU ``record_param_comms`` op: the kernel's plus its own
        (empty for a launch whose eager kernel carries no collective args)."""
        if V.COLLECTIVE_NAME not in self.annotation:
            return {}
        kernel = {k: v for k, v in self.annotation.items() if k not in _LANE_KEYS}
        return {**kernel, **self.cpu_only}


_LANE_KEYS = (V.NAME, V.STREAM)


class Recording(list):  # list[Record], live: grows while the block runs
    """The records of one ``record()`` block."""

    #: Only the launches made through torch's Python API (``record(python_api_only=True)``).
    python_api_only = False

    def apis(self) -> list[str]:
        return [r.api for r in self]


_tuple_new = tuple.__new__


def new_record(api: str, annotation: dict[str, Any], site: str, cpu_only: dict[str, Any]
               ) -> Record:
    """``Record(api, annotation, site, cpu_only)``, without NamedTuple's argument parsing."""
    return _tuple_new(Record, (api, annotation, site, cpu_only))

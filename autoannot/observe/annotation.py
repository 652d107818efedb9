"""The annotation context entered around a collective launch.

It hands the launch to the agent's sink (``keep.sink``): the record file as it is entered,
torch's ``mark_kernels`` around it where torch records in a CUDA-graph capture, its graph's
ledger and the recorders once it returned.
"""

from __future__ import annotations

from typing import Any

from autoannot.describe.kinds import Kind
from autoannot.keep.sink import LaunchEvent


class AnnotationContext:
    """Context manager for one collective launch; reusable once entered and exited.

    ``agent``: what it reports to (the agent's ``Instrumentation``: its ``state`` and
    ``captures``); None: nothing (a context made for its annotation alone). ``python_api``:
    whether the launch was made through torch's Python API (else a ``record(python_api_only=
    True)`` leaves it out)."""

    __slots__ = ("_event", "_inner", "agent", "annotation", "api", "call_site", "cpu_only",
                 "kernels", "python_api")

    def __init__(
        self,
        api: str,
        annotation: dict[str, Any],
        cpu_only: dict[str, Any] | None = None,
        kernels: tuple[str, ...] = (),
        site: str | None = None,
        agent: Any = None,
        python_api: bool = True,
    ) -> None:
        self.api = api
        self.annotation = annotation
        self.cpu_only = cpu_only or {}  # the CPU op's own keys ("Rank", ...)
        self.kernels = kernels  # NCCL kernel families the launch may run (for graph ledgers)
        self.call_site = site
        self.agent = agent
        self.python_api = python_api  # false: a launch below torch's Python API
        self._inner: Any = None
        self._event: LaunchEvent | None = None

    def __enter__(self) -> AnnotationContext:
        agent = self.agent
        if agent is not None:
            event = self.event()
            self._inner = agent.sink.entered(event)
            self._event = event
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        event, self._event = self._event, None
        scope, self._inner = self._inner, None
        if event is None:
            return
        if exc_type is None:
            self.agent.sink.returned(event, scope)
        else:  # (a launch that raised was not issued)
            self.agent.sink.failed(scope, exc if exc is not None else exc_type())

    def event(self) -> LaunchEvent:
        """The launch this context annotates, as the sink takes it."""
        return LaunchEvent(Kind(self.api, self.annotation, self.cpu_only, self.kernels, None),
                           self.call_site, self.python_api)

    def __repr__(self) -> str:
        return f"AnnotationContext({self.api!r}, {self.annotation!r})"

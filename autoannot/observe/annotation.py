"""The annotation context entered around a collective launch.

It hands the launch to the agent's route (``keep.route``): the record file and rings as it is
entered, torch's ``mark_kernels`` around it where torch records in a CUDA-graph capture, its
graph's ledger and the recorders once it returned.
"""

from __future__ import annotations

from typing import Any

from autoannot.describe.kinds import Kind


class AnnotationContext:
    """Context manager for one collective launch; reusable once entered and exited.

    ``agent``: what it reports to (the agent's ``Instrumentation``: its ``state`` and
    ``captures``); None: nothing (a context made for its annotation alone). ``python_api``:
    whether the launch was made through torch's Python API (else a ``record(python_api_only=
    True)`` leaves it out)."""

    __slots__ = ("_entered", "agent", "annotation", "api", "call_site", "cpu_only", "kernels",
                 "python_api")

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
        self._entered: Any = None  # (the route's, while entered)

    def __enter__(self) -> AnnotationContext:
        agent = self.agent
        if agent is not None:
            self._entered = agent.state.route.entered(self.kind(), self.call_site,
                                                      self.python_api)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        entered, self._entered = self._entered, None
        if entered is None:
            return
        if exc_type is None:
            entered.returned()
        else:  # (a launch that raised was not issued)
            entered.failed(exc if exc is not None else exc_type())

    def kind(self) -> Kind:
        """The launch this context annotates, as the route takes it."""
        return Kind(self.api, self.annotation, self.cpu_only, self.kernels, None)

    def __repr__(self) -> str:
        return f"AnnotationContext({self.api!r}, {self.annotation!r})"

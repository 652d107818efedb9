"""The annotation context entered around a collective launch.

It enters torch's ``mark_kernels`` where torch has it and a CUDA-graph capture is in progress,
notes the launch in its graph's ledger (``captures.note``), writes it to the open journals
before it runs and, when it returns, to the open recorders.
"""

from __future__ import annotations

from typing import Any

from autoannot.records import enter, new_record, publish
from autoannot.sites import call_site


class AnnotationContext:
    """Context manager for one collective launch; reusable once entered and exited.

    ``agent``: what it reports to (the agent's ``Instrumentation``: its ``state`` and
    ``captures``); None: nothing (a context made for its annotation alone). ``python_api``:
    whether the launch was made through torch's Python API (else a ``record(python_api_only=
    True)`` leaves it out)."""

    __slots__ = ("_inner", "agent", "annotation", "api", "call_site", "cpu_only", "kernels",
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
        self._inner: Any = None

    def __enter__(self) -> AnnotationContext:
        agent = self.agent
        state = agent.state if agent is not None else None
        if state is not None and state.journals:  # before the launch: a hang is in the file
            site = self.call_site or call_site(2)
            enter(state, new_record(self.api, self.annotation, site, self.cpu_only))
        if state is not None and state.captures:
            agent.captures.note(self.api, self.annotation, self.kernels, self.call_site)
            mark_kernels = agent.captures.torch_marks
            if mark_kernels is not None:
                self._inner = mark_kernels(self.annotation)
                self._inner.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.__exit__(exc_type, exc, tb)
        state = self.agent.state if self.agent is not None else None
        if exc_type is None and state is not None and state.recorders:
            site = self.call_site or call_site(2)
            publish(state, new_record(self.api, self.annotation, site, self.cpu_only),
                    self.python_api)

    def __repr__(self) -> str:
        return f"AnnotationContext({self.api!r}, {self.annotation!r})"

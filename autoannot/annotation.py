"""The annotation context entered around each collective launch.

It enters torch's ``mark_kernels`` where torch has it and a CUDA-graph capture is in progress,
tells the capture listeners (the CUDA-graph fallback ledger hooks in here), and, when the launch
returns, publishes a Record to the open recorders.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoannot import features
from autoannot.recorder import call_site, enter, new_record, publish
from autoannot.state import STATE

#: Called on each launch while a capture is in progress, with its api, annotation, kernel
#: families and call site (None: the listener finds it).
capture_listeners: list[Callable[[str, dict[str, Any], tuple[str, ...], str | None], None]] = []


class AnnotationContext:
    """Context manager for one collective launch; reusable once entered and exited."""

    __slots__ = ("_inner", "annotation", "api", "call_site", "cpu_only", "kernels")

    def __init__(
        self,
        api: str,
        annotation: dict[str, Any],
        cpu_only: dict[str, Any] | None = None,
        kernels: tuple[str, ...] = (),
        site: str | None = None,
    ) -> None:
        self.api = api
        self.annotation = annotation
        self.cpu_only = cpu_only or {}  # the CPU op's own keys ("Rank", ...)
        self.kernels = kernels  # NCCL kernel families the launch may run (for graph ledgers)
        self.call_site = site
        self._inner: Any = None

    def __enter__(self) -> AnnotationContext:
        if STATE.journals:  # before the launch: a collective that hangs is in the file
            site = self.call_site or call_site(2)
            enter(new_record(self.api, self.annotation, site, self.cpu_only))
        if STATE.captures:
            for listener in capture_listeners:
                listener(self.api, self.annotation, self.kernels, self.call_site)
            mark_kernels = features.mark_kernels()
            if mark_kernels is not None:
                self._inner = mark_kernels(self.annotation)
                self._inner.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.__exit__(exc_type, exc, tb)
        if exc_type is None and STATE.recorders:
            site = self.call_site or call_site(2)
            publish(new_record(self.api, self.annotation, site, self.cpu_only))

    def __repr__(self) -> str:
        return f"AnnotationContext({self.api!r}, {self.annotation!r})"


def annotate_collective(
    collective_name: str, input_tensor: Any, output_tensor: Any, group: Any = None
) -> AnnotationContext:
    """The tutorial's helper, exact: the annotation context for ``collective_name`` run on
    ``input_tensor`` -> ``output_tensor`` in ``group``, as the agent would enter it.

    ``collective_name`` is an API name ("all_reduce", "all_gather_into_tensor", "funcol.all_reduce")
    or an eager name ("allreduce", "_allgather_base").
    """
    from autoannot import collectives, metadata

    row = collectives.lookup(collective_name)
    params = {"group": group, "tensor": input_tensor, "input": input_tensor,
              "input_tensor": input_tensor, "self": input_tensor, "inputs": input_tensor,
              "tensors": input_tensor, "input_tensor_list": input_tensor,
              "input_list": input_tensor, "output": output_tensor,
              "output_tensor": output_tensor, "tensor_list": output_tensor,
              "output_tensor_list": output_tensor}
    if row.outputs == "tensor":  # scatter: the parameter named "tensor" is the output
        params["tensor"] = output_tensor
    launch = metadata.derive(row, None, (), params)
    api = row.api if row.module == collectives.C10D else f"funcol.{row.api}"
    return AnnotationContext(api, metadata.annotation_of(api, launch),
                             metadata.cpu_only_args(launch), launch.kernels)


def describe_call(function: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The annotation the agent would attach to ``function(*args, **kwargs)``, without running it.

    ``function`` is a wrapped collective (``dist.all_reduce``, ``funcol.all_gather_tensor``, ...),
    patched or not, or a ``torch.ops._c10d_functional`` op. Raises if it is not one, or if its
    metadata cannot be derived.
    """
    from autoannot import collectives, metadata

    original = getattr(function, "__wrapped__", function)
    original = getattr(original, "default", original)  # an op's packet: its only overload
    schema = getattr(original, "_schema", None)
    if schema is not None:  # torch.ops._c10d_functional.<op>.default
        namespace, _, name = schema.name.partition("::")
        qualname = f"torch.ops.{namespace}.{name}"
    else:
        qualname = f"{getattr(original, '__module__', '')}.{getattr(original, '__name__', '')}"
    row = collectives.BY_QUALNAME.get(qualname)
    if row is None or row.role is not collectives.Role.LAUNCH:
        raise ValueError(f"{qualname} is not a collective autoannot annotates on its own")
    launch = metadata.derive(row, original, args, kwargs)
    return metadata.annotation_of(row.label, launch)


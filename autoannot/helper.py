"""The tutorial's helper, done by the agent's rules: ``annotate_collective`` and
``describe_call``."""

from __future__ import annotations

from typing import Any

from autoannot.agent.instrumentation import INSTRUMENTATION
from autoannot.describe import collectives, metadata
from autoannot.observe.annotation import AnnotationContext


def annotate_collective(
    collective_name: str, input_tensor: Any, output_tensor: Any, group: Any = None
) -> AnnotationContext:
    """The tutorial's helper, exact: the annotation context for ``collective_name`` run on
    ``input_tensor`` -> ``output_tensor`` in ``group``, as the agent would enter it.

    ``collective_name`` is an API name ("all_reduce", "all_gather_into_tensor", "funcol.all_reduce")
    or an eager name ("allreduce", "_allgather_base"), or a symm_mem op
    ("symm_mem.one_shot_all_reduce": ``group`` a ProcessGroup or its name).
    """
    row = collectives.lookup(collective_name)
    params = {"group": group, "tensor": input_tensor, "input": input_tensor,
              "input_tensor": input_tensor, "self": input_tensor, "inputs": input_tensor,
              "tensors": input_tensor, "input_tensor_list": input_tensor,
              "input_list": input_tensor, "output": output_tensor,
              "output_tensor": output_tensor, "tensor_list": output_tensor,
              "output_tensor_list": output_tensor, "out": output_tensor,
              "symm_buffer": input_tensor, "local_input": output_tensor,
              "group_name": getattr(group, "group_name", group)}
    if row.outputs == "tensor":  # scatter: the parameter named "tensor" is the output
        params["tensor"] = output_tensor
    launch = metadata.derive(row, None, (), params)
    api = row.label
    return AnnotationContext(api, metadata.annotation_of(api, launch),
                             metadata.cpu_only_args(launch), launch.kernels,
                             agent=INSTRUMENTATION)


def describe_call(function: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The annotation the agent would attach to ``function(*args, **kwargs)``, without running it.

    ``function`` is a wrapped collective (``dist.all_reduce``, ``funcol.all_gather_tensor``, ...),
    patched or not, or a ``torch.ops._c10d_functional`` op. Raises if it is not one, or if its
    metadata cannot be derived.
    """
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

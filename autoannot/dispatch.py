"""Compiled code: annotate the ``torch.ops._c10d_functional`` ops at torch's dispatcher.

torch.compile never runs the Python collectives we wrap: Dynamo maps ``dist.all_reduce`` & co.
to functional collectives, and the code Inductor or AOTAutograd generates calls
``torch.ops._c10d_functional.<op>.default`` directly. So each op in the table gets a Python
kernel for the ``BackendSelect`` dispatch key — a key every call passes through and that
normally falls through. The kernel runs the same launch wrapper as the Python proxies, around a
redispatch to the keys below ``BackendSelect``, that is, to torch's own kernel.

* Eager callers are annotated once: inside a wrapped Python collective (``CALLS.depth``) the
  kernel only redispatches.
* Tracing is untouched: fake, functional and meta tensors go straight through, and compiled
  graphs hold torch's own ``OpOverload`` objects (we replace no Python object).
* ``disable()`` deregisters the kernels; an op that already has a ``BackendSelect`` kernel
  (someone else's) is left alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from autoannot import collectives, metadata, wrappers
from autoannot.state import CALLS, STATE

DISPATCH_KEY = "BackendSelect"


class KernelRegistration:
    """Our kernels on torch's dispatcher; ``undo()`` takes them off (like ``Patch.undo``)."""

    __slots__ = ("library", "ops")

    def __init__(self, library: Any, ops: list[str]) -> None:
        self.library = library
        self.ops = ops

    def __repr__(self) -> str:
        return f"KernelRegistration({DISPATCH_KEY}: {', '.join(self.ops)})"

    def undo(self) -> bool:
        self.library._destroy()
        return True


def available() -> bool:
    """Whether this torch can take a Python kernel that redispatches (``with_keyset``)."""
    import inspect

    import torch

    try:
        impl = torch.library.Library.impl
        return ("with_keyset" in inspect.signature(impl).parameters
                and hasattr(torch._C, "_dispatch_keyset_full_after")
                and hasattr(torch.ops, "_c10d_functional"))
    except Exception:
        return False


def _is_real(value: Any) -> bool:
    """A tensor that holds data (not fake, functional or meta), or a list starting with one."""
    import torch

    if isinstance(value, list | tuple):
        value = value[0] if value else None
    return (type(value) in (torch.Tensor, torch.nn.Parameter)
            and value.device.type != "meta")


def _kernel(op: Any, wrapper: wrappers.Wrapper, below: Any) -> Callable[..., Any]:
    redispatch = op.redispatch

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if STATE.demand and not CALLS.depth and args and _is_real(args[0]):
            return wrapper(functools.partial(redispatch, keyset & below), None, args, kwargs)
        return redispatch(keyset & below, *args, **kwargs)

    kernel.__name__ = f"autoannot_{op.__name__.replace('.', '_')}"
    return kernel


def install(module: ModuleType) -> list[KernelRegistration]:
    """Register a kernel for every op of the table that this torch has."""
    import torch

    if not available():
        return []
    namespace = torch.ops._c10d_functional
    below = torch._C._dispatch_keyset_full_after(getattr(torch._C.DispatchKey, DISPATCH_KEY))
    library = torch.library.Library("_c10d_functional", "IMPL")
    registered = []
    for row in collectives.COLLECTIVES:
        if row.module != collectives.OPS:
            continue
        try:
            op = getattr(namespace, row.api).default
        except AttributeError:  # not in this torch
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), DISPATCH_KEY):
            continue  # someone else's kernel (or ours, still registered)
        wrapper = wrappers.launch_wrapper(row, metadata.Plan(row, op))
        library.impl(row.api, _kernel(op, wrapper, below), DISPATCH_KEY, with_keyset=True)
        registered.append(row.api)
    if not registered:
        library._destroy()
        return []
    return [KernelRegistration(library, registered)]

"""How the agent patches: ``Patch`` (one attribute replaced, undone by identity), the one
proxy cache, and putting a collective's proxy in every module that binds it.

Imports neither torch nor wrapt at import (the start-up hook imports the agent's owner, which
imports this module).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing is not imported at start-up: it costs milliseconds
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any


class Patch:
    """One attribute we replaced: ``setattr(owner, name, replacement)`` over ``original``."""

    __slots__ = ("name", "original", "owner", "replacement")

    def __init__(self, owner: Any, name: str, original: Any, replacement: Any) -> None:
        self.owner = owner  # a module or a class
        self.name = name
        self.original = original
        self.replacement = replacement

    def __repr__(self) -> str:
        owner = getattr(self.owner, "__name__", self.owner)
        return f"Patch({owner}.{self.name})"

    def current(self) -> Any:
        namespace = self.owner.__dict__
        return namespace.get(self.name)

    def undo(self) -> bool:
        """Restore the original unless someone replaced our proxy since (then leave theirs)."""
        if self.current() is self.replacement:
            setattr(self.owner, self.name, self.original)
            return True
        return False


class ProxyCache:
    """The one proxy made for each original object (functions, methods), reused across
    enable/disable cycles: ``disable()`` restores the original, ``enable()`` the same proxy."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Any, Any]] = {}  # id(original) -> (original, proxy)

    def get(self, original: Any) -> Any:
        """The proxy made for ``original``, or None."""
        entry = self._entries.get(id(original))
        return entry[1] if entry is not None and entry[0] is original else None

    def put(self, original: Any, proxy: Any) -> Any:
        self._entries[id(original)] = (original, proxy)
        return proxy

    def is_proxy(self, obj: Any) -> bool:
        """Whether ``obj`` is one of the proxies made here."""
        wrapped = getattr(obj, "__wrapped__", None)
        return wrapped is not None and self.get(wrapped) is obj

    def originals_by_proxy_id(self) -> dict[int, Any]:
        return {id(proxy): original for original, proxy in self._entries.values()}


def install_module(module: ModuleType, agent: Any) -> list[Patch]:
    """A proxy for every collective of the table ``module`` holds, in every loaded module
    that binds it (``agent``: the ``Instrumentation`` its wrappers report to)."""
    from autoannot.describe import collectives, metadata

    rows = [row for row in collectives.COLLECTIVES if row.module == module.__name__]
    replacements: dict[str, tuple[Any, Any, Any]] = {}
    for row in rows:
        original = module.__dict__.get(row.api)
        if original is None or agent.proxies.is_proxy(original):
            continue
        plan = metadata.Plan(row, original)
        proxy = _proxy_for(original, row, plan, agent)
        replacements[row.api] = (
            original, proxy, lambda obj, row=row, plan=plan: _proxy_for(obj, row, plan, agent)
        )
    patches = _replace_everywhere(replacements, agent.proxies)
    if module.__name__ == collectives.C10D:
        patches += _install_p2p_op(module, agent.proxies)
    return patches


def install_op_namespace(namespace: Any, agent: Any) -> list[Patch]:
    """A proxy for every op of the table in a ``torch.ops`` namespace (``torch.ops.symm_mem``):
    its packet, where ``torch.ops.<ns>.<op>(...)`` finds it, and each overload on the packet
    itself, where ``.default`` finds it (compiled code, callers holding the packet)."""
    from autoannot.describe import collectives, metadata

    patches = []
    for row in collectives.COLLECTIVES:
        if row.module != namespace.__name__:
            continue
        try:
            packet = getattr(namespace, row.api)  # (torch makes the packet on first lookup)
        except (AttributeError, RuntimeError):  # not in this torch
            continue
        if agent.proxies.is_proxy(packet):
            continue
        overloads = {name: getattr(packet, name) for name in packet.overloads()}
        for name, overload in overloads.items():
            if agent.proxies.is_proxy(overload):
                continue
            proxy = _proxy_for(overload, row, metadata.Plan(row, overload), agent)
            setattr(packet, name, proxy)
            patches.append(Patch(packet, name, overload, proxy))
        plan = metadata.Plan(row, overloads.get("default"))
        proxy = _proxy_for(packet, row, plan, agent)
        setattr(namespace, row.api, proxy)
        patches.append(Patch(namespace, row.api, packet, proxy))
    return patches


def _proxy_for(original: Any, row: Any, plan: Any, agent: Any) -> Any:
    import functools

    from autoannot.agent import proxies
    from autoannot.describe.collectives import SYMM_MEM, Role
    from autoannot.observe import wrappers

    proxy = agent.proxies.get(original)
    if proxy is not None:
        return proxy
    wrapper = wrappers.WRAPPER_FACTORIES[row.role](row, plan, agent)
    wrapper = _handing_off(row, plan, wrapper, agent)
    # The fast path: wrapt's C code asks ``enabled`` (a C-level callable, no Python frame) and,
    # while nothing wants annotations, calls the original itself. The wrapper never runs, so
    # no frame of ours sits between the caller and torch (warnings keep their stack levels).
    enabled = (None if row.role is Role.BATCH
               else functools.partial(getattr, agent.state, "demand"))
    kind = proxies.OpProxy if row.module == SYMM_MEM else proxies.CollectiveProxy
    return agent.proxies.put(original, kind(original, wrapper, enabled=enabled))


def _handing_off(row: Any, plan: Any, wrapper: Any, agent: Any) -> Any:
    """A ``torch.distributed`` launch's wrapper, as the native module's C function where it
    is built: in a capture it notes the launch itself where the call's arguments make a key
    (``plan.key_fields()``; what ``wrapper.noted_as`` derived for it, once per key), or hands
    it to the observer (label and call site kept); with one ring alone open it writes the
    launch's record through the ring writer (its ids told by ``wrapper.ring_ids``, once per
    key); no Python frame of ours either way. Else it calls ``wrapper`` (see
    native/observer.cpp)."""
    from autoannot.describe import collectives
    from autoannot.describe.collectives import Role

    if row.module != collectives.C10D or row.role is not Role.LAUNCH:
        return wrapper
    module = agent.proxies_native_module()
    if module is None:
        return wrapper
    fields = plan.key_fields() if row.group_arg is collectives.GroupArg.C10D else None
    return module.handoff_wrapper(wrapper, row.label, wrapper.note_in_capture,
                                  wrapper.noted_as, fields, _key_context, wrapper.ring_ids)


def _key_context() -> tuple[Any, Any, Any]:
    """What the native wrappers key calls by, asked at their first keyed call (they are made
    while torch imports): c10d's ``_world`` (None: absent), ``torch.Tensor``, ``Parameter``."""
    import torch

    from autoannot.describe import metadata

    return metadata.default_group_holder(), torch.Tensor, torch.nn.Parameter


def _wraps(obj: Any, original: Any) -> bool:
    """Whether ``obj`` is someone else's wrapper (``__wrapped__`` chain) around ``original``."""
    for _ in range(16):
        obj = getattr(obj, "__wrapped__", None)
        if obj is None:
            return False
        if obj is original:
            return True
    return False


def _replace_everywhere(replacements: dict[str, tuple[Any, Any, Any]], proxies: ProxyCache
                        ) -> list[Patch]:
    """Swap each original for its proxy in every loaded module that binds it under its name.
    A module that binds someone else's wrapper of it gets our proxy over that wrapper."""
    patches = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, (original, proxy, make_proxy) in replacements.items():
            bound = namespace.get(name)
            if bound is original:
                setattr(module, name, proxy)
                patches.append(Patch(module, name, original, proxy))
            elif bound is not None and not proxies.is_proxy(bound) and _wraps(bound, original):
                theirs = make_proxy(bound)
                setattr(module, name, theirs)
                patches.append(Patch(module, name, bound, theirs))
    return patches


def unbind_proxies_everywhere(proxies: ProxyCache) -> None:
    """Modules that copied a proxy after we patched (``from ... import *`` at torch's import,
    a user's ``from torch.distributed import all_reduce``) get the original back too."""
    from autoannot.describe import collectives

    originals = proxies.originals_by_proxy_id()
    names = {row.api for row in collectives.COLLECTIVES
             if row.module in collectives.FUNCTION_MODULES}
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name in names:
            bound = namespace.get(name)
            if bound is not None and id(bound) in originals and proxies.is_proxy(bound):
                setattr(module, name, originals[id(bound)])


def _install_p2p_op(c10d: ModuleType, proxies: ProxyCache) -> list[Patch]:
    """P2POp keeps the original isend/irecv, so P2POps outlive disable(); batch_isend_irecv's
    wrapper hands torch copies that name what c10d's module holds."""
    import wrapt

    p2p_op = getattr(c10d, "P2POp", None)
    init = p2p_op.__dict__.get("__init__") if p2p_op is not None else None
    if init is None or proxies.is_proxy(init):
        return []

    def unwrap_op(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if args and proxies.is_proxy(args[0]):
            args = (args[0].__wrapped__, *args[1:])
        elif proxies.is_proxy(kwargs.get("op")):
            kwargs = {**kwargs, "op": kwargs["op"].__wrapped__}
        return wrapped(*args, **kwargs)

    proxy = proxies.get(init) or proxies.put(init, wrapt.FunctionWrapper(init, unwrap_op))
    p2p_op.__init__ = proxy
    return [Patch(p2p_op, "__init__", init, proxy)]


class SwitchedPatch(Patch):
    """A patch put on and taken off while the agent is on (``switch``); undone by identity."""

    __slots__ = ()

    def switch(self, on: bool) -> None:
        current = self.current()
        if on and current is self.original:
            setattr(self.owner, self.name, self.replacement)
        elif not on and current is self.replacement:
            setattr(self.owner, self.name, self.original)

    def undo(self) -> bool:
        restored = self.current() is self.replacement
        self.switch(False)
        return restored


def wrap_attribute(owner: Any, name: str, wrapper: Any, proxies: Any) -> list[Patch]:
    """Put a proxy (the one cached for the original in ``proxies``) over ``owner.name``."""
    original = owner.__dict__.get(name) if owner is not None else None
    if original is None or proxies.is_proxy(original):
        return []  # absent, or already ours
    import wrapt  # (not at start-up)

    proxy = proxies.get(original) or proxies.put(original,
                                                 wrapt.FunctionWrapper(original, wrapper))
    setattr(owner, name, proxy)
    return [Patch(owner, name, original, proxy)]

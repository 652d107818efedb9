"""The proxy class put in place of each collective: a ``wrapt.FunctionWrapper`` that pickles
and copies as the function it wraps.

A function pickles by reference (its module and name) and copies as itself. A proxy does the
same: ``pickle.dumps(dist.all_reduce)`` gives the bytes it gives with the agent off (the
module holds the proxy, so the reference finds it), and a copy is the proxy itself. A
``functools.partial`` made before ``enable()`` holds the original function, which pickle
refuses while its module holds the proxy ("not the same object"): while the agent is on, a
``copyreg`` reducer for ``functools.partial`` hands pickle the proxy instead (the same bytes
again). An original function held directly by some other object cannot be helped: pickle
checks functions by identity, before any hook; under ``AUTOANNOT=1`` no user code ever holds one.
"""

from __future__ import annotations

import copy
import copyreg
import functools
import sys
from typing import Any

import wrapt

_FunctionWrapperBase = wrapt.FunctionWrapper.__mro__[1]  # (wrapt's C type, or its Python one)

#: What a proxy of an unbound function hands its wrapper as ``instance`` (the wrappers ignore
#: it). wrapt asks a wrapped function for ``__self__`` on every call where the instance is None
#: (a bound method's, if it is one): for a plain function that raises and clears an
#: AttributeError, ~80% of a pass-through proxy's cost. Binding as a method (``__get__``) is
#: wrapt's own either way.
UNBOUND = type("Unbound", (), {"__repr__": lambda self: "UNBOUND", "__slots__": ()})()


class CollectiveProxy(wrapt.FunctionWrapper):
    """A collective's proxy; see the module docstring."""

    def __init__(self, wrapped: Any, wrapper: Any, enabled: Any = None) -> None:
        super().__init__(wrapped, wrapper, enabled)
        if getattr(wrapped, "__self__", None) is None:  # (asked once, here)
            _FunctionWrapperBase.__init__(self, wrapped, UNBOUND, wrapper, enabled,
                                          self._self_binding)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return _reference(self)

    def __reduce__(self) -> Any:
        return _reference(self)

    def __copy__(self) -> CollectiveProxy:
        return self

    def __deepcopy__(self, memo: Any) -> CollectiveProxy:
        return self


class OpProxy(CollectiveProxy):
    """The proxy of a ``torch.ops`` op (a packet or an overload): it pickles and copies as the
    op does (torch's ops do not pickle; a copy of an overload is a new overload)."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.__wrapped__.__reduce_ex__(protocol)

    def __reduce__(self) -> Any:
        return self.__wrapped__.__reduce__()

    def __copy__(self) -> Any:
        return copy.copy(self.__wrapped__)


def _reference(proxy: Any) -> Any:
    """Pickle's reduction of a function: its qualified name, looked up in its module (where
    the proxy is, while the agent is on). After ``disable()`` the module holds the original:
    then a reference that finds whatever the module holds when loaded."""
    wrapped = proxy.__wrapped__
    module_name, qualname = wrapped.__module__, wrapped.__qualname__
    if _lookup(module_name, qualname) is proxy:
        return qualname
    import pydoc

    return pydoc.locate, (f"{module_name}.{qualname}",)


def _lookup(module_name: str, qualname: str) -> Any:
    value: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        value = getattr(value, part, None)
    return value


def _reduce_partial(partial: functools.partial) -> Any:
    """``functools.partial.__reduce__``, with a collective the agent has replaced in its module
    named by its proxy (what pickle finds there)."""
    reduced = partial.__reduce__()
    func = partial.func
    if isinstance(func, CollectiveProxy) or _PROXY_OF is None:
        return reduced
    proxy = _PROXY_OF(func)
    if proxy is None or _lookup(func.__module__, func.__qualname__) is not proxy:
        return reduced
    cls, _, state = reduced
    return cls, (proxy,), (proxy, *state[1:])


_PROXY_OF: Any = None  # original -> its proxy or None, while installed


def install_partial_reducer(proxy_of: Any) -> None:
    """While the agent is on: partials over replaced originals pickle. Leaves another
    library's reducer for partials alone."""
    global _PROXY_OF
    current = copyreg.dispatch_table.get(functools.partial)
    if current is None or current is _reduce_partial:
        _PROXY_OF = proxy_of
        copyreg.dispatch_table[functools.partial] = _reduce_partial


def remove_partial_reducer() -> None:
    global _PROXY_OF
    _PROXY_OF = None
    if copyreg.dispatch_table.get(functools.partial) is _reduce_partial:
        del copyreg.dispatch_table[functools.partial]

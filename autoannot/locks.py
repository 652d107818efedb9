"""The agent's locks, renewed in a forked child: a lock another thread held at ``fork()`` would
stay held in the child for good (its next ``enable()``, record or capture would hang).

``renewed(owner, name)`` sets ``owner.name`` to a new lock now and after every fork; code reads
the lock from there each time (``with _lock:`` on a module global, or ``self._lock``).
Imports nothing but ``_thread`` and ``os``: the start-up hook uses it.
"""

from __future__ import annotations

import _thread
import os
import weakref

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_owners: list[tuple[object, str, bool]] = []  # (owner or weakref to it, name, reentrant)


def renewed(owner: object, name: str, reentrant: bool = False) -> Any:
    """Give ``owner`` a lock named ``name``, renewed after each fork; returns it (assign it to
    the same name)."""
    try:
        ref: object = weakref.ref(owner)
    except TypeError:  # a module: lives as long as the process
        ref = owner
    _owners.append((ref, name, reentrant))
    lock = _thread.RLock() if reentrant else _thread.allocate_lock()
    setattr(owner, name, lock)
    return lock


def _renew_all() -> None:
    live = []
    for ref, name, reentrant in _owners:
        owner = ref() if isinstance(ref, weakref.ref) else ref
        if owner is None:
            continue
        setattr(owner, name, _thread.RLock() if reentrant else _thread.allocate_lock())
        live.append((ref, name, reentrant))
    _owners[:] = live


def count() -> int:
    """How many locks are renewed after a fork (for tests)."""
    return len(_owners)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_all)

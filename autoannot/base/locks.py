"""The agent's locks, renewed in a forked child: a lock another thread held at ``fork()`` would
stay held in the child for good (its next ``enable()``, record or capture would hang).

``renewed(owner, name)`` sets ``owner.name`` to a new lock now and after every fork; code reads
the lock from there each time (``with _lock:`` on a module global, or ``self._lock``).
Imports nothing but ``_thread`` and ``os``: the start-up hook uses it.
"""

from __future__ import annotations

import _thread
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: (owner, name, reentrant). The owners are the agent's modules and its long-lived objects
#: (the state, the dispatcher layer, the record file): held for the life of the process.
_owners: list[tuple[object, str, bool]] = []


def renewed(owner: object, name: str, reentrant: bool = False) -> Any:
    """Give ``owner`` a lock named ``name``, renewed after each fork; returns it (assign it to
    the same name)."""
    _owners.append((owner, name, reentrant))
    lock = _thread.RLock() if reentrant else _thread.allocate_lock()
    setattr(owner, name, lock)
    return lock


def _renew_all() -> None:
    for owner, name, reentrant in _owners:
        setattr(owner, name, _thread.RLock() if reentrant else _thread.allocate_lock())


def count() -> int:
    """How many locks are renewed after a fork (for tests)."""
    return len(_owners)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_all)

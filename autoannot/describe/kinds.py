"""Kinds of launch: launches alike in all their annotation says (the same collective, group,
sizes and dtype), derived once and shared; and the one cache every observer keeps them in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from autoannot.describe import groups, metadata

#: Kinds one cache keeps before it lets them all go (training repeats a few kinds; a job whose
#: sizes keep changing, a varying MoE all-to-all, makes new ones for good).
LIMIT = 4096


class Kind(NamedTuple):
    """What every launch of one kind gets, derived once and shared by them all (read-only:
    never change its dicts)."""

    label: str  # the function called, e.g. "all_reduce" or "funcol.all_gather_tensor"
    annotation: dict[str, Any]  # the eager kernel's args, then the lane's name and stream
    cpu_only: dict[str, Any]  # the CPU op's own keys ("Rank", ...)
    kernels: tuple[str, ...]  # the NCCL kernel families the launch may run
    facts: metadata.LaunchFacts | None  # what it was derived from (None: given, not derived)


def kind_of(label: str, launch: metadata.LaunchFacts, untold: tuple[str, ...] = ()) -> Kind:
    """The kind of ``launch`` made under ``label``; ``untold``: fields its observer was not
    told, left out of the annotation (never invented)."""
    annotation = metadata.annotation_of(label, launch)
    for field in untold:
        del annotation[field]
    return Kind(label, annotation, metadata.cpu_only_args(launch), launch.kernels, launch)


class Kinds:
    """Kinds by a key. At most ``limit`` are kept (then all are let go, and counted); keys that
    hold a group's ``id()`` are let go when a group is gone, before its id can be reused.
    ``by_key`` is the dict itself, for a hot path's ``by_key.get(key)``."""

    __slots__ = ("by_key", "let_go", "limit")

    def __init__(self, limit: int | None = LIMIT) -> None:
        self.by_key: dict[Any, Kind | None] = groups.id_keyed()
        self.limit = limit  # None: the owner bounds it (``keep_only``)
        self.let_go = 0  # kinds let go so far

    def __len__(self) -> int:
        return len(self.by_key)

    def get(self, key: Any) -> Kind | None:
        return self.by_key.get(key)

    def keep(self, key: Any, kind: Kind | None) -> Kind | None:
        """Keep ``kind`` under ``key`` (None: a kind that could not be derived) and return it."""
        by_key = self.by_key
        if self.limit is not None and len(by_key) >= self.limit:
            self.let_go += len(by_key)
            by_key.clear()
        by_key[key] = kind
        return kind

    def found_or_kept(self, key: Any, derive: Callable[[], Kind | None]) -> Kind | None:
        """The kind kept under ``key``, or ``derive()``'s, kept (``key`` None: derived each
        time, never kept)."""
        if key is None:
            return derive()
        kind = self.by_key.get(key)
        return kind if kind is not None else self.keep(key, derive())

    def keep_only(self, wanted: Callable[[Any], bool]) -> None:
        """Let go of every kind whose key is not ``wanted`` (counted)."""
        kept = {key: kind for key, kind in self.by_key.items() if wanted(key)}
        self.let_go += len(self.by_key) - len(kept)
        self.by_key.clear()
        self.by_key.update(kept)

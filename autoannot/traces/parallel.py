"""Trace work over many files on all cores: results in the order of the files, one progress
line for all of them."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class Progress:
    """``[done/total] what`` on stderr, rewritten in place: only on a terminal (nothing in a
    log), and only for work long enough to watch (more than one file, running over
    ``AFTER_S``)."""

    AFTER_S = 2.0

    def __init__(self, total: int) -> None:
        self.total, self.done, self.shown = total, 0, False
        self.live = sys.stderr.isatty()
        self.started = time.monotonic()

    def step(self, what: object) -> None:
        self.done += 1
        if self.total < 2 or not self.live:
            return
        if not self.shown and time.monotonic() - self.started < self.AFTER_S:
            return
        self.shown = True
        end = "\n" if self.done == self.total else ""
        print(f"\r\033[K[{self.done}/{self.total}] {what}", end=end, file=sys.stderr,
              flush=True)


def map_files(function: Callable[[T], R], items: Sequence[T], jobs: int | None = None,
              label: str = "", name: Callable[[T], object] = str, show: bool = True,
              outcome: Callable[[R], str] | None = None) -> Iterator[R]:
    """``function(item)`` for each item, on up to ``jobs`` processes (default: the cores),
    yielded in the order of ``items``. One process (or one item): no pool at all.
    ``function`` must be picklable (a module-level function). The progress line says
    ``label`` of each item, or ``outcome(result)`` where given (``"failed"``, ...)."""
    jobs = min(jobs or default_jobs(), len(items))
    progress = Progress(len(items) if show else 0)
    if jobs <= 1:
        for item in items:
            result = function(item)
            progress.step(f"{outcome(result) if outcome else label} {name(item)}")
            yield result
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(function, item) for item in items]
        for item, future in zip(items, futures, strict=True):
            result: Any = future.result()
            progress.step(f"{outcome(result) if outcome else label} {name(item)}")
            yield result

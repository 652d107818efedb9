"""How far a command's long work got, on stderr: one line rewritten in place, only on a
terminal and only for work that runs past ``Progress.AFTER_S`` — counted in tasks or files
(``[3/42] matching``), or in bytes of one file read (a bar)."""

from __future__ import annotations

import os
import sys
import time

#: Seconds of work before progress shows (default 2).
AFTER_VARIABLE = "AUTOANNOT_PROGRESS_AFTER_S"


class Progress:
    """Progress of ``total`` tasks (each ``step`` one, said with what it was), or of
    ``total`` bytes of the file ``label`` (``bar``: each ``step`` the bytes read). A count
    shows where there are two tasks or more; a bar where the command shows progress
    (``show``: a library caller's reads draw none)."""

    AFTER_S = 2.0
    bars = False  # (the command line's choice: ``show``)

    def __init__(self, total: int, label: str = "", bar: bool = False) -> None:
        self.total, self.done, self.shown = max(total, 0), 0, False
        self.label, self.bar = label, bar
        self.live = sys.stderr.isatty() and (Progress.bars if bar else self.total >= 2)
        self.started = time.monotonic()

    def step(self, what: object = "", amount: int = 1) -> None:
        """``amount`` more done (``what``: the task's words)."""
        self.done += amount
        if not self.live:
            return
        if not self.shown and time.monotonic() - self.started < self.AFTER_S:
            return
        self.shown = True
        if self.bar:  # (a .gz file: what was decompressed against its size on disk)
            filled = int(min(self.done / max(self.total, 1), 1.0) * 30)
            print(f"\r\033[K{self.label[:40]:40} [{'#' * filled}{'.' * (30 - filled)}]",
                  end="", file=sys.stderr, flush=True)
            return
        end = "\n" if self.done == self.total else ""
        print(f"\r\033[K[{self.done}/{self.total}] {what}", end=end, file=sys.stderr,
              flush=True)

    def close(self) -> None:
        """The bar taken off the line (a count ends its own line at its last task)."""
        if self.shown and self.bar:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
        self.shown = False


def show(on: bool) -> None:
    """Whether reading a file may draw a bar (the command line: not ``-q``), and after how
    long work shows progress (``AUTOANNOT_PROGRESS_AFTER_S``, seconds). ValueError where
    that is not a number of seconds."""
    Progress.bars = on
    after = os.environ.get(AFTER_VARIABLE, "").strip()
    if after:
        try:
            seconds = float(after)
            if not seconds >= 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"{AFTER_VARIABLE}={after!r}: not a number of seconds "
                             "(>= 0)") from None
        Progress.AFTER_S = seconds

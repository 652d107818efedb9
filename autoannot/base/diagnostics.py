"""What the agent says about itself: once per API and cause, and never as an exception in your
code, whatever the warning filters.

A diagnostic is an ``AutoannotWarning`` (a ``RuntimeWarning``: ``-W ignore::RuntimeWarning``
or ``warnings.filterwarnings("ignore", category=autoannot.AutoannotWarning)`` silences it).
Where a filter turns warnings into errors (``-W error``, pytest's ``filterwarnings = error``),
the same message goes to the ``autoannot`` logger instead (stderr, when logging is not set
up): the collective has run, and its result is not lost to a warning raised after it.
"""

from __future__ import annotations

import logging
import warnings

LOGGER = logging.getLogger("autoannot")


class AutoannotWarning(RuntimeWarning):
    """The agent could not do its part (the collective itself ran)."""


_said: set[str] = set()


def warn_once(api: str, what: str, exc: BaseException, stacklevel: int = 4) -> None:
    """Say once per API and problem that ``what`` failed for ``api``."""
    say_once(f"{api}:{what}", f"autoannot: {what} for {api} failed ({type(exc).__name__}: "
             f"{exc}); the collective ran without an annotation", stacklevel + 1)


def say_once(key: str, message: str, stacklevel: int = 4) -> None:
    """Say ``message`` once per ``key``, as an AutoannotWarning (or a log line where a filter
    would raise it)."""
    if key in _said:
        return
    _said.add(key)
    try:
        warnings.warn(message, AutoannotWarning, stacklevel=stacklevel)
    except Exception:  # a filter made it an error: never raise into the caller
        LOGGER.warning(message)

"""Call sites: the line of the user's code a collective was launched from.

A launch's call site is its first frame outside torch (its tests count as callers), wrapt,
autoannot and the standard library; each code object is classified once and each call site's
text made once (``SITES``).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

_OWN_PREFIX = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # autoannot's files
_PACKAGE_FOLDERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


class _Places:
    """Where no call site is: torch (but its tests, ``torch/testing``: their lines are the
    callers), wrapt, autoannot, and the standard library (threading, multiprocessing, runpy,
    unittest: no collective is written there), but packages installed inside its folder."""

    def __init__(self) -> None:
        import torch
        import wrapt

        roots = [os.path.dirname(m.__file__) + os.sep for m in (torch, wrapt) if m.__file__]
        self.libraries = (*roots, _OWN_PREFIX + os.sep)
        self.tests = (os.path.join(os.path.dirname(torch.__file__ or ""), "testing") + os.sep,)
        # The standard library's folders: where ``os`` and ``threading`` are (``sysconfig``
        # says the same, after ~2 ms of reading the build's configuration, on a first capture).
        self.stdlib = tuple({os.path.dirname(os.path.realpath(m.__file__)) + os.sep
                             for m in (os, threading) if m.__file__}
                            | {os.path.dirname(m.__file__) + os.sep
                               for m in (os, threading) if m.__file__})

    def is_library(self, filename: str) -> bool:
        if filename.startswith(self.tests):
            return False
        if filename.startswith(self.libraries):
            return True
        if filename.startswith(self.stdlib):
            return not any(folder in filename for folder in _PACKAGE_FOLDERS)
        return False


_PLACES: list[_Places] = []


#: The call site of a launch made from C++ with no Python code on the thread's stack (autograd's
#: engine threads: DDP's reducer, a backward's collectives).
NO_PYTHON_CALLER = "<C++: no Python caller>"
#: The call site of a C++-origin launch the native observer noted in a capture (it reads no
#: Python frames: the launching thread does not hold the GIL; a Python-API launch it notes
#: has its proxy's call site).
NATIVE_CALLER = "<C++: noted by the native observer>"
#: The call site of a launch whose Python callers are all torch's or the standard library's.
TORCH_CALLER = "<no user frame>"


#: ``id(code object)`` -> (the code object, None when it is not the user's (see ``_Places``:
#: look further up), else its call sites ``{f_lasti: "file.py:line"}``): a launch site is
#: looked up once per call site. Keyed by identity (the entry holds its code object, so the id
#: is not reused while it is here): a code object hashes its name, constants and names at every
#: lookup, ~0.4-2k instructions a frame.
SITES: dict[int, tuple[Any, dict[int, str] | None]] = {}


def call_site(depth: int = 2) -> str:
    """``"file.py:line"`` of the first frame outside torch (its tests count as callers), wrapt,
    autoannot and the standard library (``depth``: where to start, as for ``sys._getframe``)."""
    return site_from(sys._getframe(depth))


#: A file's name -> whether it holds no call site (``_Places``): the walk up a launch's stack
#: asks this of each frame, by its code's file name (a string hashes once), before its code
#: object: ~1.2k instructions a frame of torch's where the code object's entry took ~1.7k.
LIBRARY_FILES: dict[str, bool] = {}


def site_from(frame: Any) -> str:
    """``call_site`` from ``frame`` up (None: no Python frame)."""
    start = frame
    library_files = LIBRARY_FILES
    while frame is not None:
        code = frame.f_code
        library = library_files.get(code.co_filename)
        if library is None:
            library = _library_file(code.co_filename)
        if not library:
            entry = SITES.get(id(code))
            sites = entry[1] if entry is not None and entry[0] is code else _classify(code)
            if sites is not None:
                site = sites.get(frame.f_lasti)
                if site is None:
                    site = sites[frame.f_lasti] = f"{code.co_filename}:{frame.f_lineno}"
                return site
        frame = frame.f_back
    while start is not None:  # no user frame: were they all autoannot's?
        if not start.f_code.co_filename.startswith(_OWN_PREFIX):
            return TORCH_CALLER
        start = start.f_back
    return NO_PYTHON_CALLER


def _library_file(filename: str) -> bool:
    if not _PLACES:
        _PLACES.append(_Places())
    library = _PLACES[0].is_library(filename)
    if len(LIBRARY_FILES) >= 65536:  # (generated files' names: bounded)
        LIBRARY_FILES.clear()
    LIBRARY_FILES[filename] = library
    return library


def _classify(code: Any) -> dict[int, str] | None:
    if not _PLACES:
        _PLACES.append(_Places())
    sites = None if _PLACES[0].is_library(code.co_filename) else {}
    if len(SITES) >= 65536:  # code objects of generated functions: bounded
        SITES.clear()
    SITES[id(code)] = (code, sites)
    return sites

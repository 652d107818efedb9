"""The optional native module: the observer (``observer.cpp``: collective launches seen through
torch's RecordFunction callbacks, in C++), the ring's writer with torch's process-group
hooks in C++ where torch's groups take hooks (``ring_hooks.cpp``), and the c10d kernels that
write the ring's launches below the Python API where they take none (``ring_kernels.cpp``).

It is compiled against the torch it runs with (a torch extension: a C++ ABI per torch build),
once, by ``autoannot build-native`` (``torch.utils.cpp_extension``: a C++ compiler and ninja),
into ``AUTOANNOT_NATIVE_DIR`` (default ``~/.cache/autoannot/native``), one folder per torch
version, Python and source. The agent loads it where it is built for this torch and
``AUTOANNOT_NATIVE`` is not off; it never builds it on its own (a build takes a minute).
``autoannot.observe.native_observer`` drives it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

SOURCES = [Path(__file__).with_name(name)
           for name in ("observer.cpp", "ring_hooks.cpp", "ring_kernels.cpp")]
HEADERS = [Path(__file__).with_name(name) for name in ("shared.h", "ring_format.h")]
#: -DNDEBUG: torch's headers declare some classes (RecordFunction) with other members without
#: it; an extension must see them as torch's release build was compiled.
CFLAGS = ["-O2", "-DNDEBUG"]


def cflags() -> list[str]:
    """The compiler's flags for this torch: the process-group hooks are compiled in where its
    groups take them (a feature of the torch, detected, not a version)."""
    from autoannot.base import features

    return CFLAGS + (["-DAUTOANNOT_GROUP_HOOKS=1"] if features.group_hooks_available() else [])


def _tag() -> str:
    import torch
    import torch.distributed  # (its groups' hooks are looked for)

    text = b"".join(path.read_bytes() for path in SOURCES + HEADERS) + " ".join(cflags()).encode()
    digest = hashlib.sha1(text).hexdigest()[:12]
    tag = f"torch{torch.__version__}_{sys.implementation.cache_tag}_{digest}"
    return "".join(c if c.isalnum() else "_" for c in tag)  # a C identifier


def module_name() -> str:
    return f"autoannot_native_{_tag()}"


def build_dir() -> Path:
    base = os.environ.get("AUTOANNOT_NATIVE_DIR") or Path.home() / ".cache" / "autoannot" / "native"
    return Path(base) / _tag()


def built_path() -> Path | None:
    """The compiled module for this torch, Python and source; None if not built."""
    directory = build_dir()
    for candidate in sorted(directory.glob(f"{module_name()}*.so")) if directory.is_dir() else ():
        return candidate
    return None


def missing_tools() -> str:
    """What a build needs and this machine lacks ('' when nothing): a C++ compiler (``CXX``, or
    ``c++``/``g++``/``clang++`` on the PATH) and ninja."""
    import shutil

    missing = []
    compiler = os.environ.get("CXX") or "c++"
    if not any(shutil.which(c) for c in (compiler, "c++", "g++", "clang++")):
        missing.append("no C++ compiler (install g++ or clang, or set CXX)")
    beside = Path(sys.executable).parent / "ninja"  # (pip's ninja, in this environment)
    if shutil.which("ninja") is None and not beside.exists():
        missing.append("no ninja (pip install ninja)")
    return "; ".join(missing)


def build(verbose: bool = False) -> Path:
    """Compile the observer for this torch (a minute; a second time: nothing to do)."""
    from torch.utils import cpp_extension

    directory = build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(name=module_name(), sources=[str(path) for path in SOURCES],
                       build_directory=str(directory), extra_cflags=cflags(), verbose=verbose,
                       is_python_module=True)
    path = built_path()
    if path is None:
        raise RuntimeError(f"the build left no module in {directory}")
    return path


_loaded: dict[str, Any] = {}  # path -> the module (a module is loaded once a process)


def load() -> Any:
    """The native module where it is built for this torch; else None. Raises what loading it
    raises."""
    path = built_path()
    if path is None:
        return None
    module = _loaded.get(str(path))
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name(), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[str(path)] = module
    return module


class TensorFacts:
    """Stands in for a noted tensor where the launch's metadata is derived: what ``metadata``
    reads of a tensor (dtype, element count, shape), and no data."""

    __slots__ = ("_numel", "dtype", "shape")
    is_meta = False

    def __init__(self, dtype: Any, sizes: tuple[int, ...]) -> None:
        import torch

        self.dtype = dtype
        self.shape = torch.Size(sizes)
        self._numel = self.shape.numel()

    def numel(self) -> int:
        return self._numel

    def is_complex(self) -> bool:
        return self.dtype.is_complex

    def __repr__(self) -> str:
        return f"TensorFacts({self.dtype}, {tuple(self.shape)})"


def stand_in(value: Any) -> Any:
    """A noted argument as ``metadata`` reads it: tensors become ``TensorFacts``."""
    if type(value) is tuple and len(value) == 3 and value[0] == "tensor":
        return TensorFacts(value[1], value[2])
    if type(value) is list:
        return [stand_in(item) for item in value]
    return value

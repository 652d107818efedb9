"""The optional native kernel: c10d launches in a CUDA-graph capture noted in C++.

Torch calling a Python kernel costs ~10 us a launch, ~50 us on autograd's threads, whatever
the kernel does (measured on 2 x H200: a whole DDP step captured 1.16x slower with a
pass-through Python kernel on its 24 bucket all-reduces). ``kernel.cpp`` notes such launches
in C++ while a capture is in progress; the Python layer derives their annotations from the
notes when the capture ends (``notes_to_entries``), with the rules every other launch goes
through (``metadata.Plan``). The Python API's proxies hand it their captured launches
(``handoff_wrapper``: a C wrapper that keeps the proxy's label and call site for the note).

It is compiled against the torch it runs with (a torch extension: a C++ ABI per torch build),
once, by ``autoannot build-native`` (``torch.utils.cpp_extension``: a C++ compiler and ninja),
into ``AUTOANNOT_NATIVE_DIR`` (default ``~/.cache/autoannot/native``), one folder per torch
version, Python and source. The agent loads it where it is built for this torch and
``AUTOANNOT_NATIVE`` is not off; never builds it on its own (a build takes a minute).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("kernel.cpp")
_loaded: list[Any] = []  # [module or None], once looked for


def _tag() -> str:
    import torch

    digest = hashlib.sha1(SOURCE.read_bytes()).hexdigest()[:12]
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


def build(verbose: bool = False) -> Path:
    """Compile the kernel for this torch (a minute; a second time: nothing to do)."""
    from torch.utils import cpp_extension

    directory = build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(name=module_name(), sources=[str(SOURCE)], build_directory=str(directory),
                       extra_cflags=["-O2"], verbose=verbose, is_python_module=True)
    path = built_path()
    if path is None:
        raise RuntimeError(f"the build left no module in {directory}")
    return path


def enabled() -> bool:
    from autoannot import config

    return config.flag("AUTOANNOT_NATIVE", True)


def load() -> Any:
    """The native module where it is built for this torch and not turned off; else None
    (looked for once a process)."""
    if _loaded:
        return _loaded[0]
    module = None
    try:
        path = built_path() if enabled() else None
        if path is not None:
            name = module_name()
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            from autoannot import recorder  # the proxies' call sites, as Python finds them

            module.set_site_resolver(recorder.SITES, recorder.site_from)
    except Exception as exc:  # the Python kernels annotate these launches instead
        from autoannot import diagnostics

        diagnostics.warn_once("native kernel", "loading", exc)
        module = None
    _loaded[:] = [module]
    return module


def loaded() -> Any:
    """The module if ``load()`` found it (None otherwise, or before)."""
    return _loaded[0] if _loaded else None


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

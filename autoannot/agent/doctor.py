"""``autoannot doctor``: what this machine has, which annotation path the agent will take, and
what is missing for torch's own (toolsId) path. Works on a CPU-only machine."""

from __future__ import annotations

import importlib.metadata
import os
import site
import sys
from pathlib import Path
from typing import Any

from autoannot.base import config

NEEDED_CUDA_BINDINGS = (13, 1)
NEEDED_DRIVER = 13010  # CUDA 13.1, as cudaDriverGetVersion reports it


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _tuple(version: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (version or "").split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _hook_state() -> dict[str, Any]:
    roots = [*site.getsitepackages(), site.getusersitepackages()]
    pth = [str(Path(r) / "autoannot-startup.pth") for r in roots
           if (Path(r) / "autoannot-startup.pth").exists()]
    hook_dir = str(Path(__file__).parents[1] / "_hook")
    on_path = any(os.path.abspath(p) == hook_dir for p in sys.path)
    value = os.environ.get("AUTOANNOT", "")
    fires = config.flag_value_is_valid(value) and config.agent_requested({"AUTOANNOT": value})
    state = {"pth_files": pth, "sitecustomize_on_path": on_path,
             "installed": bool(pth) or on_path, "AUTOANNOT": value or None,
             "would_fire": (bool(pth) or on_path) and fires}
    if not config.flag_value_is_valid(value):
        state["problem"] = (f"AUTOANNOT={value!r} is not one of {'/'.join(config.TRUE)} or "
                            f"{'/'.join(config.FALSE[1:])}: the agent stays off")
    return state


def diagnose() -> dict[str, Any]:
    """Everything the report says, as data."""
    report: dict[str, Any] = {"python": sys.version.split()[0], "autoannot": None,
                              "wrapt": _version("wrapt"), "cuda_bindings": None,
                              "torch": None, "cuda_runtime": None, "driver": None,
                              "nccl": None, "gpus": 0}
    import autoannot

    report["autoannot"] = autoannot.__version__
    missing: list[str] = []
    try:
        import torch
    except ImportError:
        report["path"] = "none"
        report["missing"] = ["torch is not installed: pip install torch (./install.sh takes "
                             "the CPU wheel)"]
        report["hook"] = _hook_state()
        return report
    report["torch"] = torch.__version__
    report["cuda_runtime"] = torch.version.cuda
    cuda = torch.cuda.is_available()
    report["gpus"] = torch.cuda.device_count() if cuda else 0
    if cuda:
        try:
            report["driver"] = torch._C._cuda_getDriverVersion()
        except Exception:
            report["driver"] = None
        try:
            report["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            report["nccl"] = None
    bindings = _version("cuda-bindings") or _version("cuda-python")
    report["cuda_bindings"] = bindings

    from autoannot.base import features

    api = features.graph_annotations()
    report["torch_annotation_module"] = api.where if api is not None else None
    if api is None:
        missing.append("torch has no graph-annotation module (torch.cuda.graph_annotations "
                       "from 2.14, torch.cuda._graph_annotations in 2.12-2.13): upgrade torch "
                       "to >= 2.12")
    if not cuda:
        missing.append("no CUDA device: CUDA graphs (and toolsId) need a GPU; on this machine "
                       "the agent annotates eager collectives and records them")
    if bindings is None:
        missing.append("cuda-bindings is not installed: pip install 'cuda-bindings>=13.1'")
    elif _tuple(bindings) < NEEDED_CUDA_BINDINGS:
        missing.append(f"cuda-bindings {bindings} has no cudaGraphNodeGetToolsId: pip install "
                       "--upgrade 'cuda-bindings>=13.1'")
    driver = report["driver"]
    if cuda and isinstance(driver, int) and driver < NEEDED_DRIVER:
        missing.append(f"the CUDA driver supports CUDA {driver // 1000}.{driver % 1000 // 10}; "
                       "cudaGraphNodeGetToolsId needs 13.1 (a newer driver, or cuda-compat)")
    if not missing and api is not None:
        try:
            unavailable = api.tools_id_unavailable()
        except Exception as exc:
            missing.append(f"probing cudaGraphNodeGetToolsId failed: {exc}")
        else:
            if unavailable is None:
                missing.append("this torch's graph annotations have no toolsId probe")
            elif unavailable:
                missing.append("cudaGraphNodeGetToolsId is unavailable (the driver answered "
                               "cudaErrorCallRequiresNewerDriver)")
    from autoannot.keep import capture_identity

    settings = config.from_environment()
    report["native_observer"] = _native_observer(settings)
    report["group_hooks"] = _group_hooks(settings)
    report["compiled_code"], report["cpp_origin"] = _below_the_api(settings)
    report["capture_identity"] = capture_identity.CaptureIdentity().how
    report["path"] = "torch toolsId" if not missing else "autoannot fallback (capture ledgers)"
    report["missing"] = missing
    report["hook"] = _hook_state()
    return report


def _below_the_api(settings: Any) -> tuple[str, str]:
    """How launches below the Python API are seen here: compiled code's, C++-origin ones."""
    if not settings.ops:
        return ("not annotated: AUTOANNOT_OPS=0",) * 2  # type: ignore[return-value]
    from autoannot.observe import group_hooks

    if group_hooks.observe(settings):
        line = ("annotated through torch's process-group hooks (every group, every thread; no "
                "dispatch key, no compiler)")
        return line, line
    from autoannot import native

    if settings.native and native.built_path() is not None:
        line = ("annotated by the native observer (torch's RecordFunction callbacks, on every "
                "thread; no dispatch key) — for the always-on ring alone, by its C++ kernels on "
                "the c10d:: ops (torch's BackendSelect key) instead")
        return line, line
    from autoannot.observe import python_layer

    lines = []
    for family, what in zip(python_layer.FAMILIES, ("_c10d_functional", "c10d::"), strict=True):
        why = python_layer.unavailable(family)
        lines.append(f"not annotated: {why}" if why else
                     f"annotated by the Python layer (a {python_layer.KEY} kernel per {what} op, "
                     "registered while a capture or record() asks, on their threads only; "
                     "steps aside where another library owns the key)")
    return lines[0], lines[1]


def _group_hooks(settings: Any) -> str:
    """Whether this torch's process groups take collective hooks, and what they do here."""
    from autoannot.observe import group_hooks

    if "torch.distributed.distributed_c10d" not in sys.modules:
        try:
            import torch.distributed  # noqa: F401  (to ask its process groups)
        except Exception:
            return "torch.distributed cannot be imported here"
    if not group_hooks.available():
        return ("this torch's process groups take no collective hooks (they come with torch "
                "2.14): the observers above see every launch below the Python API")
    if not settings.ops:
        return "on this torch, but not used: AUTOANNOT_OPS=0"
    if not settings.group_hooks:
        return ("on this torch, but not used: AUTOANNOT_GROUP_HOOKS=0 (the native observer or "
                "the Python layer observe instead)")
    return ("on this torch (ProcessGroup.register_pre_hook): the observer of every launch no "
            "proxy sees, on every group — captures, record() and the record file; the native "
            "observer and the Python layer are not used")


def _native_observer(settings: Any) -> str:
    from autoannot import native
    from autoannot.observe import group_hooks

    if not settings.native:
        return "off (AUTOANNOT_NATIVE=0)"
    if group_hooks.observe(settings):
        path = native.built_path()
        if path is None:
            return ("not used: this torch's process-group hooks observe instead, in Python "
                    "(autoannot build-native: in C++, the always-on ring written there)")
        return (f"built ({path}): its process-group hooks, in C++, stand in for Python's and "
                "write the always-on ring themselves (AUTOANNOT_GROUP_HOOKS=0: the observer, "
                "through RecordFunction callbacks, instead)")
    path = native.built_path()
    if path is None:
        return ("not built for this torch (autoannot build-native): launches below the "
                "Python API go through the Python layer")
    return (f"built ({path}): launches below the Python API are seen through torch's "
            "RecordFunction callbacks; captured launches are noted in C++ from torch's own "
            "record of them; while the always-on ring is all that is open, its C++ kernels on "
            "the c10d:: ops (torch's BackendSelect key, registered then, removed at disable()) "
            "write them to the ring, and no operator pays")


#: The report's answers about launches, each with what it is said as.
_SAID = (("compiled_code", "torch.compile'd collectives"),
         ("cpp_origin", "launches no proxy sees (DDP's reducer, backward, ProcessGroup calls)"),
         ("native_observer", "native observer"),
         ("group_hooks", "process-group hooks"),
         ("capture_identity", "a launch is tied to its CUDA-graph capture by"))


def format_report(report: dict[str, Any]) -> str:
    lines = ["autoannot doctor", ""]
    for key in ("python", "autoannot", "torch", "cuda_runtime", "driver", "nccl", "gpus",
                "cuda_bindings", "wrapt", "torch_annotation_module"):
        lines.append(f"  {key:24} {report.get(key) if report.get(key) is not None else '-'}")
    lines += ["", f"  annotation path: {report['path']}"]
    for key, said in _SAID:
        if report.get(key):
            lines.append(f"  {said}: {report[key]}")
    if report.get("missing"):
        lines.append("  for torch's toolsId path:")
        lines += [f"    - {m}" for m in report["missing"]]
    hook = report["hook"]
    lines += ["", f"  start-up hook installed: {'yes' if hook['installed'] else 'no'}"
              + (f" ({', '.join(hook['pth_files'])})" if hook["pth_files"] else ""),
              f"  AUTOANNOT={hook['AUTOANNOT'] or '(unset)'}: the hook "
              + ("would fire in a new process" if hook["would_fire"] else "would not fire")]
    if hook.get("problem"):
        lines.append(f"  {hook['problem']}")
    if not hook["installed"]:
        lines.append("    install with pip (./install.sh), or run under `autoannot run`")
    return "\n".join(lines)

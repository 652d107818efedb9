"""Configuration from ``AUTOANNOT*`` environment variables (documented in the README), parsed
here and nowhere else. Imports nothing but ``os`` and ``sys``: the start-up hook uses it.

A flag is on for ``1``/``true``/``yes``/``on`` and off for ``0``/``false``/``no``/``off`` or
empty (any case, spaces ignored). Any other value is a mistake: it is reported once on stderr,
and the flag is off (a typo never turns the agent, or one of its features, on).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")
_reported: set[str] = set()


def flag(name: str, default: bool, env: Mapping[str, str] | None = None) -> bool:
    """The value of the flag ``name`` (``default`` where unset); see the module's docstring."""
    value = (os.environ if env is None else env).get(name)
    if value is None:
        return default
    word = value.strip().lower()
    if word in TRUE:
        return True
    if word not in FALSE and name not in _reported:
        _reported.add(name)
        sys.stderr.write(f"autoannot: {name}={value!r} is not one of {'/'.join(TRUE)} or "
                         f"{'/'.join(FALSE[1:])}: taken as off\n")
    return False


def flag_value_is_valid(value: str) -> bool:
    return value.strip().lower() in TRUE + FALSE


class Config:
    """The agent's settings, read once (when it is enabled).

    ``AUTOANNOT_MARK_KERNELS`` (default 1): enter torch's ``mark_kernels`` during captures where
    torch has it. ``AUTOANNOT_TORCH_ANNOTATIONS`` (default 1): where torch's toolsId path works,
    turn ``enable_annotations`` on for every ``torch.cuda.graph`` capture.
    ``AUTOANNOT_ANNOTATE_ON_EXPORT`` (default 0): each rank annotates the trace it exports, in
    place; ``AUTOANNOT_LANES`` (default 0): with annotated kernels moved to their process
    group's lane. ``AUTOANNOT_OPS`` (default 1): observe the launches no proxy sees (compiled
    code, DDP's reducer, autograd, C++). ``AUTOANNOT_NATIVE`` (default 1): through the native
    observer where it is built. ``AUTOANNOT_GROUP_HOOKS`` (default 1): through torch's
    process-group hooks where torch has them (>= 2.14), instead of either.
    ``AUTOANNOT_VERIFY`` (default 0): compare each capture's collectives across ranks when it
    ends. ``AUTOANNOT_ROWS`` (default 1): each rank writes the
    rows of the trace it exports beside it (``traces.rows``)."""

    __slots__ = ("annotate_on_export", "group_hooks", "lanes", "mark_kernels", "native", "ops",
                 "rows_on_export", "torch_annotations", "verify")

    def __init__(self, mark_kernels: bool = True, torch_annotations: bool = True,
                 annotate_on_export: bool = False, lanes: bool = False, ops: bool = True,
                 native: bool = True, verify: bool = False,
                 rows_on_export: bool = True, group_hooks: bool = True) -> None:
        self.mark_kernels = mark_kernels
        self.torch_annotations = torch_annotations
        self.annotate_on_export = annotate_on_export
        self.lanes = lanes
        self.ops = ops
        self.native = native
        self.verify = verify
        self.rows_on_export = rows_on_export
        self.group_hooks = group_hooks

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{name}={getattr(self, name)}"
                                     for name in self.__slots__) + ")"


def record_template(env: Mapping[str, str] | None = None) -> str | None:
    """``AUTOANNOT_RECORD``: the record file's path template (see journal.py); None if unset
    or empty."""
    return (os.environ if env is None else env).get("AUTOANNOT_RECORD") or None


def ring_folder(env: Mapping[str, str] | None = None) -> str | None:
    """``AUTOANNOT_RING``: the folder of the always-on recorder's ring files (see
    ``keep/ring.py``); None if unset."""
    return (os.environ if env is None else env).get("AUTOANNOT_RING") or None


def ring_wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether a ring is kept: ``AUTOANNOT_RING`` names its folder, or the watch asks for one
    (``AUTOANNOT_WATCH``, ``AUTOANNOT_WATCH_STORE``: then in its run's folder,
    ``base.run_folders``)."""
    return (ring_folder(env) is not None or watch_requested(env) or watch_store_set(env))


def ring_launches(env: Mapping[str, str] | None = None) -> int:
    """``AUTOANNOT_RING_LAUNCHES``: how many launches a rank's ring keeps (65,536 by default;
    48 bytes each). ValueError for a value that is no positive whole number."""
    value = (os.environ if env is None else env).get("AUTOANNOT_RING_LAUNCHES", "").strip()
    if not value:
        return 1 << 16
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{value!r} is no positive whole number")
    return int(value)


def gpu_times(env: Mapping[str, str] | None = None) -> bool:
    """``AUTOANNOT_GPU_TIMES``: whether a ring with files times its launches on CUDA tensors on
    the GPU (``keep/gpu_clock.py``); on by default (``0`` turns it off)."""
    return flag("AUTOANNOT_GPU_TIMES", True, env)


def gpu_graph_ends(env: Mapping[str, str] | None = None) -> bool:
    """``AUTOANNOT_GPU_GRAPH_ENDS=1``: a graph's collectives get their GPU end too, not their
    start alone (a stamp after each: ~3% of a replay of small kernels, measured on an H100)."""
    return flag("AUTOANNOT_GPU_GRAPH_ENDS", False, env)


def gpu_driver_events(env: Mapping[str, str] | None = None) -> bool:
    """``AUTOANNOT_GPU_DRIVER_EVENTS``: an eager collective's timing events are made and read
    through the CUDA driver's API (``DriverEvents``), not torch's ``Event``."""
    return flag("AUTOANNOT_GPU_DRIVER_EVENTS", False, env)


def gpu_eager_stamps(env: Mapping[str, str] | None = None) -> bool:
    """``AUTOANNOT_GPU_EAGER_STAMPS`` (on by default; ``0``: off): an eager collective is timed
    by stamps on a branch of its stream, as a graph's are, not by two events on it (which hold
    the stream's work after them: +3.2 us a collective on an H100, stamps +0.04)."""
    return flag("AUTOANNOT_GPU_EAGER_STAMPS", True, env)


def watch_requested(env: Mapping[str, str] | None = None) -> bool:
    """``AUTOANNOT_WATCH=1``: rank 0 watches the job's rings live (``live/watch.py``)."""
    return flag("AUTOANNOT_WATCH", False, env)


def watch_interval(env: Mapping[str, str] | None = None) -> float:
    """``AUTOANNOT_WATCH_INTERVAL``: seconds between a watcher's looks (1 by default); a hang is
    said once no rank has launched for ``AUTOANNOT_WATCH_STALL`` (5 by default)."""
    return _seconds("AUTOANNOT_WATCH_INTERVAL", 1.0, env)


def watch_prometheus(env: Mapping[str, str] | None = None) -> int | None:
    """``AUTOANNOT_WATCH_PROMETHEUS``: the port rank 0's watcher serves Prometheus metrics on
    (None: unset). ValueError for a value that is no port."""
    value = (os.environ if env is None else env).get("AUTOANNOT_WATCH_PROMETHEUS", "").strip()
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ValueError(f"AUTOANNOT_WATCH_PROMETHEUS={value!r} is no port")
    return int(value)


def watch_store_set(env: Mapping[str, str] | None = None) -> bool:
    return bool((os.environ if env is None else env).get("AUTOANNOT_WATCH_STORE", "").strip())


def watch_store(env: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """``AUTOANNOT_WATCH_STORE``: the c10d store (a TCPStore) every rank publishes its
    progress to, and rank 0's watcher reads: ``HOST:PORT``, or ``job`` for the job's own
    (``MASTER_ADDR:MASTER_PORT``, as ``env://`` and torchrun set them); None if unset.
    ValueError for a value that names no store."""
    environ = os.environ if env is None else env
    value = environ.get("AUTOANNOT_WATCH_STORE", "").strip()
    if not value:
        return None
    if value == "job":
        host, port = environ.get("MASTER_ADDR", ""), environ.get("MASTER_PORT", "")
        if not host or not port:
            raise ValueError("AUTOANNOT_WATCH_STORE=job: MASTER_ADDR and MASTER_PORT are unset")
        value = f"{host}:{port}"
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"AUTOANNOT_WATCH_STORE={value!r} is no HOST:PORT")
    return host, int(port)


def watch_stall(env: Mapping[str, str] | None = None) -> float:
    return _seconds("AUTOANNOT_WATCH_STALL", 5.0, env)


def _seconds(name: str, default: float, env: Mapping[str, str] | None) -> float:
    value = (os.environ if env is None else env).get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is no number of seconds") from None
    if not seconds > 0:
        raise ValueError(f"{name}={value!r}: must be more than 0")
    return seconds


def agent_requested(env: Mapping[str, str] | None = None) -> bool:
    """``AUTOANNOT``: turn the agent on at start-up."""
    return flag("AUTOANNOT", False, env)


def from_environment(env: Mapping[str, str] | None = None) -> Config:
    return Config(
        mark_kernels=flag("AUTOANNOT_MARK_KERNELS", True, env),
        torch_annotations=flag("AUTOANNOT_TORCH_ANNOTATIONS", True, env),
        annotate_on_export=flag("AUTOANNOT_ANNOTATE_ON_EXPORT", False, env),
        lanes=flag("AUTOANNOT_LANES", False, env),
        ops=flag("AUTOANNOT_OPS", True, env),
        native=flag("AUTOANNOT_NATIVE", True, env),
        verify=flag("AUTOANNOT_VERIFY", False, env),
        rows_on_export=flag("AUTOANNOT_ROWS", True, env),
        group_hooks=flag("AUTOANNOT_GROUP_HOOKS", True, env),
    )

"""Configuration from ``AUTOANNOT*`` environment variables (documented in the README)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

_FALSE = ("", "0", "false", "no", "off")


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name)
    if value is None:
        return default
    return value.strip().lower() not in _FALSE


@dataclass(frozen=True)
class Config:
    """``AUTOANNOT_MARK_KERNELS`` (default 1): enter torch's ``mark_kernels`` during captures where
    torch has it. ``AUTOANNOT_TORCH_ANNOTATIONS`` (default 1): where torch's toolsId path works,
    turn ``enable_annotations`` on for every ``torch.cuda.graph`` capture.
    ``AUTOANNOT_ANNOTATE_ON_EXPORT`` (default 0): each rank annotates the trace it exports, in
    place; ``AUTOANNOT_LANES`` (default 0): with annotated kernels moved to their process
    group's lane. ``AUTOANNOT_OPS`` (default 1): put kernels on torch's dispatcher for the
    launches no proxy sees (compiled code, DDP's reducer, autograd, C++).
    (``AUTOANNOT`` itself is read by the start-up hooks, which must not import this.)"""

    mark_kernels: bool = True
    torch_annotations: bool = True
    annotate_on_export: bool = False
    lanes: bool = False
    ops: bool = True


def from_environment(env: Mapping[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    return Config(
        mark_kernels=_flag(env, "AUTOANNOT_MARK_KERNELS", True),
        torch_annotations=_flag(env, "AUTOANNOT_TORCH_ANNOTATIONS", True),
        annotate_on_export=_flag(env, "AUTOANNOT_ANNOTATE_ON_EXPORT", False),
        lanes=_flag(env, "AUTOANNOT_LANES", False),
        ops=_flag(env, "AUTOANNOT_OPS", True),
    )

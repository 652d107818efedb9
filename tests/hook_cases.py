"""Rank functions for ``test_pghooks.py``: run on real gloo ranks by ``harness.run_ranks``."""

from __future__ import annotations

import os
from typing import Any


def _torch_kernels_only() -> bool:
    """No kernel of the agent on torch's dispatcher: the Python layer never registered any,
    and no ``c10d::`` op has a kernel under its key."""
    import torch

    from autoannot import dispatch
    from autoannot.instrumentation import INSTRUMENTATION

    layer = INSTRUMENTATION.layer
    ops = [f"c10d::{name}" for name in ("allreduce_", "broadcast_", "_allgather_base_")]
    return (layer is None or layer.registrations == 0) and not any(
        torch._C._dispatch_has_kernel_for_dispatch_key(op, dispatch.KEY) for op in ops)


def _foreign_fallback() -> Any:
    """What torchdistx does when it loads: its own fallback for every op on ``DeferredInit``,
    the key the Python layer would borrow (which then steps aside)."""
    import torch

    library = torch.library.Library("_", "IMPL")
    below = torch._C._dispatch_keyset_full_after(torch._C._dispatch_key_parse("DeferredInit"))

    def fallback(keyset: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        return op.redispatch(keyset & below, *args, **kwargs)

    library.fallback(fallback, "DeferredInit", with_keyset=True)
    return library


def below_the_python_api(rank: int, world: int, foreign: bool) -> dict[str, Any]:
    """``record()`` around what no proxy sees: a DDP step (its reducer's bucket all-reduces,
    from C++ on autograd's thread), ``pg.allreduce``, a coalesced all-reduce through the group
    object, and a ``pg.allreduce`` on another thread — each counted by a hook of the test's
    own. ``foreign``: another library owns the key the Python layer would borrow."""
    import threading

    import torch
    import torch.distributed as dist

    import autoannot
    from autoannot.instrumentation import INSTRUMENTATION

    library = _foreign_fallback() if foreign else None
    autoannot.enable()
    counted: list[str] = []
    group = dist.new_group(list(range(world)))  # (made after enable: hooked as it is made)
    group.register_pre_hook(7, lambda args: counted.append(args.name.name))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)),
        process_group=group, bucket_cap_mb=0.01)
    model(torch.ones(2, 64)).sum().backward()  # (buckets rebuilt after the first step)
    counted.clear()
    elsewhere = threading.Thread(target=lambda: group.allreduce([torch.ones(11)]).wait())
    with autoannot.record() as records:
        model(torch.ones(2, 64)).sum().backward()
        group.allreduce([torch.ones(3)]).wait()
        group.allreduce_coalesced([torch.ones(2), torch.ones(5)]).wait()
        elsewhere.start()
        elsewhere.join()
    layer = INSTRUMENTATION.layer
    result = {
        "counted": counted,
        "records": [(r.api, r.annotation.get("Collective name"), r.annotation.get("In msg nelems"),
                     r.annotation.get("Process Group Name")) for r in records],
        "group_name": dist.distributed_c10d._get_process_group_name(group),
        "hooks_on_after": INSTRUMENTATION.hooks is not None and INSTRUMENTATION.hooks.on,
        "layer_made": layer is not None,
        "native_observer": INSTRUMENTATION.observer is not None,
        "torch_kernels_only": _torch_kernels_only(),
    }
    autoannot.disable()
    del library
    return result


def journal_of_a_job(rank: int, world: int, out: str) -> dict[str, Any]:
    """``AUTOANNOT_RECORD`` (set before the agent starts): a DDP step's launches in the record
    file, each once."""
    import json

    import torch
    import torch.distributed as dist

    import autoannot

    assert autoannot.is_enabled() and os.environ.get("AUTOANNOT_RECORD")
    counted: list[str] = []
    group = dist.new_group(list(range(world)))
    group.register_pre_hook(7, lambda args: counted.append(args.name.name))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32),
                                                      process_group=group)
    model(torch.ones(2, 32)).sum().backward()
    with open(f"{out}/rank{rank}.jsonl") as lines_read:
        lines = [json.loads(line) for line in lines_read]
    return {"counted": counted, "journal": [(line["api"], line["group"]) for line in lines]}

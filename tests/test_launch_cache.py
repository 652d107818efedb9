"""Launches seen before are found by their key (group id, dtypes, sizes, roots): what a cached
launch records must be what deriving it afresh gives, whatever changes between calls."""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist

import autoannot
from autoannot.describe import vocabulary as V


def _fresh(function, *args, **kwargs) -> dict:
    """The annotation derived in full, with no cache (the table's rules applied to the call)."""
    return autoannot.describe_call(function, *args, **kwargs)


def test_every_launch_records_what_deriving_it_afresh_gives(fake_world, agent) -> None:
    tp = dist.new_group([0, 1], group_desc="tp")
    calls = []
    for group in (None, tp, fake_world, tp):
        for tensor in (torch.ones(4), torch.ones(4, dtype=torch.bfloat16), torch.ones(9),
                       torch.ones(4, dtype=torch.complex64), torch.nn.Parameter(torch.ones(4))):
            calls.append((dist.all_reduce, (tensor,), {"group": group}))
            calls.append((dist.broadcast, (tensor,), {"src": 1, "group": group}))
            calls.append((dist.broadcast, (tensor, 0), {"group": group}))
            out = torch.empty(2 * tensor.numel(), dtype=tensor.dtype)
            calls.append((dist.all_gather_into_tensor, (out, tensor), {"group": group}))
            calls.append((dist.reduce_scatter_tensor, (tensor[:2].clone(), tensor.new_ones(4)),
                          {"group": group}))
    with autoannot.record() as records:
        for function, args, kwargs in calls * 2:  # the second time round: all from the cache
            function(*args, **kwargs)
    assert len(records) == 2 * len(calls)
    expected = [_fresh(f, *a, **k) for f, a, k in calls] * 2
    assert [r.annotation for r in records] == expected
    names = {r.annotation.get(V.PG_NAME) for r in records}
    assert len(names) == 2  # the default group and tp: neither taken for the other


def test_meta_tensors_are_not_taken_for_the_real_launch_of_their_shape(fake_world, agent
                                                                        ) -> None:
    real, meta = torch.ones(6), torch.ones(6, device="meta")
    with autoannot.record() as records:
        dist.all_reduce(real)
        dist.all_reduce(meta)  # tracing: nothing launches
        dist.all_reduce(real)
    assert len(records) == 2


def test_a_new_group_is_never_taken_for_a_gone_one(fake_world, agent) -> None:
    """Keys name groups by id(); a group gone and a new one (perhaps at the same address): the
    new one's launches carry the new group's name, and no launch key outlives a group."""
    from autoannot.describe import groups

    seen = []
    for desc in ("first", "second", "third"):
        group = dist.new_group([0, 1], group_desc=desc)
        with autoannot.record() as records:
            dist.all_reduce(torch.ones(3), group=group)
        seen.append((id(group), records[0].annotation[V.PG_DESC], group.group_name,
                     records[0].annotation[V.PG_NAME]))
        dist.destroy_process_group(group)
        del group
        gc.collect()
        assert not any(cache for cache in groups._id_keyed)  # its id may be reused now
    assert [s[1] for s in seen] == ["first", "second", "third"]
    assert all(name == recorded for _, _, name, recorded in seen)

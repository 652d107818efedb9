"""record() sees the launches of every thread, once each."""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

import autoannot


def test_records_from_many_threads_exactly_once(fake_world, agent) -> None:
    per_thread, threads = 200, 6
    sizes = {i: 10 + i for i in range(threads)}

    def work(i: int) -> None:
        t = torch.ones(sizes[i])
        for _ in range(per_thread):
            dist.all_reduce(t)

    with autoannot.record() as records:
        pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    assert len(records) == threads * per_thread
    counts = {}
    for r in records:
        counts[r.annotation["In msg nelems"]] = counts.get(r.annotation["In msg nelems"], 0) + 1
    assert counts == {n: per_thread for n in sizes.values()}
    assert {r.call_site.rsplit("/", 1)[-1] for r in records} == {"test_threads.py:20"}

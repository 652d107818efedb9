"""Real CPU traces for the tool tests: 2 gloo ranks profiled around a few collectives."""

from __future__ import annotations

from pathlib import Path

import harness


def _profiled_gloo_rank(rank: int, world: int, folder: str) -> str:
    import torch
    import torch.distributed as dist

    t = torch.ones(1024)
    with torch.profiler.profile() as prof:
        dist.all_reduce(t)
        dist.broadcast(t, 0)
        dist.barrier()
    path = Path(folder) / f"gloo_rank{rank}.json"
    prof.export_chrome_trace(str(path))
    return str(path)


def gloo_traces(folder: Path) -> list[Path]:
    """``folder/gloo_rank{0,1}.json``: what the profiler exports on 2 gloo ranks."""
    folder.mkdir(parents=True, exist_ok=True)
    return [Path(p) for p in harness.run_ranks(_profiled_gloo_rank, 2, args=(str(folder),))]

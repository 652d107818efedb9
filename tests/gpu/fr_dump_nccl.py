"""torch's Flight Recorder dump of a one-rank NCCL job, for the CPU tests of its reader
(``autoannot/traces/read/flight_recorder.py``): what NCCL's dumps hold that gloo's do not
(``pg_config`` naming the ranks, entries that complete, the watchdog's times).

    python tests/gpu/fr_dump_nccl.py OUT    (on a machine with a GPU)

Writes ``OUT/nccl_trace_rank_0`` (pickle, as NCCL's watchdog writes on a timeout) and
``OUT/expected.json`` (torch's version, each collective's call site as this script saw it).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "200")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch
import torch.distributed as dist


def _here() -> str:
    return f"{__file__}:{inspect.currentframe().f_back.f_lineno + 1}"  # type: ignore[union-attr]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    tp = dist.new_group([0], group_desc="tp") if "group_desc" in inspect.signature(
        dist.new_group).parameters else dist.new_group([0])
    x = torch.ones(1 << 10, device="cuda")
    sites = []
    for _ in range(3):
        sites.append(("allreduce", "0", _here()))
        dist.all_reduce(x)
        sites.append(("broadcast", "0", _here()))
        dist.broadcast(x, src=0)
        sites.append(("allreduce", "tp", _here()))
        dist.all_reduce(x, group=tp)
    sites.append(("_allgather_base", "0", _here()))
    dist.all_gather_into_tensor(torch.empty(1 << 10, device="cuda"), x)
    torch.cuda.synchronize()
    time.sleep(2)  # (the watchdog marks what completed)
    c10d = torch._C._distributed_c10d  # (NCCL's ring: its own dump where torch has one)
    dump = getattr(c10d, "_dump_nccl_trace", c10d._dump_fr_trace)
    (out / "nccl_trace_rank_0").write_bytes(dump())
    (out / "expected.json").write_text(json.dumps({
        "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "sites": sites}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Run a function on N real ranks: separate processes, a real process group (gloo or fake)."""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp


def clean_env() -> dict[str, str]:
    """This process's environment without the agent's settings, but for where the native
    module is looked for (``conftest.py`` points it at an empty folder: a test that wants the
    native observer builds it), so a child process runs the observer this test session chose."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("AUTOANNOT") or k == "AUTOANNOT_NATIVE_DIR"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_cannot(what: str, exc: BaseException) -> dict[str, str]:
    """A rank's result when torch itself, with the agent off, cannot run the scenario here
    (an older torch or its gloo lacks the feature): the test skips, saying why."""
    first_line = str(exc).strip().split("\n")[0]
    return {"torch_cannot": f"{what}: {type(exc).__name__}: {first_line[:200]}"}


def skip_if_torch_cannot(results: list[Any]) -> None:
    import pytest
    import torch

    for result in results:
        if isinstance(result, dict) and "torch_cannot" in result:
            pytest.skip(f"torch {torch.__version__} cannot run it with the agent off "
                        f"({result['torch_cannot']})")


def _entry(rank: int, fn: Callable[..., Any], world: int, backend: str, port: int,
           out: str, args: tuple, timeout_s: float) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    result: dict[str, Any]
    try:
        if backend == "fake":
            from torch.testing._internal.distributed.fake_pg import FakeStore

            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        else:
            dist.init_process_group(backend, rank=rank, world_size=world,
                                    timeout=timedelta(seconds=timeout_s))
        result = {"ok": fn(rank, world, *args)}
    except BaseException:
        result = {"error": traceback.format_exc()}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
    # Skip interpreter finalization: a gloo worker thread that drops the last reference to a
    # finished Work while Python finalizes takes the GIL, is cancelled, and aborts the process
    # ("terminate called without an active exception"; a core dump showed
    # ~AsyncAllreduceCoalescedWork -> THPVariable_clear -> take_gil -> pthread_exit). Torch's
    # exit race, not what these tests check; the result is written. Where a test asks
    # (RUN_EXIT_FUNCTIONS in the environment), the atexit functions run first, as at a normal
    # exit (what the agent does there is what it checks).
    if os.environ.get(RUN_EXIT_FUNCTIONS):
        import atexit

        atexit._run_exitfuncs()
    os._exit(0)


def _entry_as(index: int, ranks: tuple[int, ...], *rest: Any) -> None:
    _entry(ranks[index], *rest)


#: Set in the environment, the ranks of ``run_ranks`` run their atexit functions before they
#: skip the interpreter's finalization.
RUN_EXIT_FUNCTIONS = "HARNESS_RUN_EXIT_FUNCTIONS"


def run_ranks(fn: Callable[..., Any], world: int = 2, backend: str = "gloo",
              args: tuple = (), ranks: tuple[int, ...] | None = None,
              timeout_s: float = 300) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` processes; returns each rank's JSON-able result.

    ``fn`` must be a module-level function (it is pickled by reference). ``ranks`` runs only
    those ranks (the ``fake`` backend needs no peers). A rank that raised makes this raise
    with that rank's traceback. A collective that waits longer than ``timeout_s`` raises
    (torch's default waits 30 minutes).
    """
    ranks = tuple(range(world)) if ranks is None else ranks
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _entry_as,
            args=(ranks, fn, world, backend, free_port(), out, args, timeout_s),
            nprocs=len(ranks),
            join=True,
            start_method="spawn",
        )
        results = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in ranks]
    errors = [f"rank {r}:\n{res['error']}" for r, res in enumerate(results) if "error" in res]
    if errors:
        raise RuntimeError("\n".join(errors))
    return [res["ok"] for res in results]


def run_job(fn: Callable[..., Any], world: int, out: Path, args: tuple = (),
            timeout_s: float = 300, record: str | None = "rank{rank}.jsonl") -> list[Any]:
    """``run_ranks`` as users run a job: ``AUTOANNOT=1`` and ``AUTOANNOT_RECORD`` into ``out``
    (``rank{rank}.jsonl``) in the ranks' environment, this process's restored after."""
    saved = {k: os.environ.get(k) for k in ("AUTOANNOT", "AUTOANNOT_RECORD")}
    os.environ["AUTOANNOT"] = "1"
    os.environ.pop("AUTOANNOT_RECORD", None)
    if record is not None:  # (None: no record file)
        os.environ["AUTOANNOT_RECORD"] = f"{out}/{record}"
    try:
        return run_ranks(fn, world, "gloo", args, timeout_s=timeout_s)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def launch_on_gpus(worker: Callable[..., Any], world: int, out: Path) -> bool:
    """``worker(rank, world, out_dir, port)`` on ``world`` GPUs (the GPU scripts), with NCCL's
    multicast paths off as the lent machines need. False, with a message, if there are too few
    GPUs."""
    import torch

    if torch.cuda.device_count() < world:
        print(f"needs {world} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return False
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    out.mkdir(parents=True, exist_ok=True)
    print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "world", world,
          "autoannot on:", os.environ.get("AUTOANNOT"))
    mp.start_processes(worker, args=(world, str(out), free_port()), nprocs=world, join=True,
                       start_method="spawn")
    return True


FORKED_RING = """
import json, os, sys
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
import autoannot
from autoannot.agent.instrumentation import INSTRUMENTATION
from autoannot.keep.ring import Ring
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
ring = Ring(sys.argv[1])
INSTRUMENTATION.state.open_journal(ring)
autoannot.enable()
pg = dist.group.WORLD
for _ in range(3):
    pg.allreduce([torch.ones(4)])
attached = ring.writer is not None
child = os.fork()
if child == 0:  # its own ring, its own seqs; the parent's file untouched
    for _ in range(2):
        pg.allreduce([torch.ones(4)])
    os._exit(0 if ring.count == 2 else 3)
_, status = os.waitpid(child, 0)
pg.allreduce([torch.ones(4)])
print(json.dumps({"attached": attached, "child": status, "count": ring.count,
                  "written_here": WRITTEN_HERE}))
"""


def forked_ring(folder: Path, written_here: str) -> tuple[dict[str, Any], Path, Path]:
    """A process with the always-on ring open, 3 ``pg.allreduce`` on a fake group, a child forked
    that makes 2 more, then one more in the parent: what it said (``written_here``: a Python
    expression there, the launches the native module wrote with no Python call), and its two
    rings' files, the parent's and the child's."""
    import json
    import subprocess
    import sys

    from autoannot.traces.read import ring_files

    script = FORKED_RING.replace("WRITTEN_HERE", written_here)
    done = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    parent, child = sorted(ring_files.in_folder(folder), key=lambda p: len(p.name))
    return said, parent, child

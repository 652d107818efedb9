"""Who runs the analysis's partition tasks (``partitions``): this process, a pool of this
machine's processes, or a Dask cluster. Every engine runs the same functions on the same
partitions and gives their results in the order asked, so every engine's answers are the
same.

Dask, as Nsight Systems' NCCL recipes use it: started the way its users start it (a
scheduler's address, or a local cluster of N worker processes, each with its memory limit),
its own scheduling, retries (a task of a worker lost mid-run runs again elsewhere) and
transport. Nothing is written by a task: a failed run leaves nothing behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from autoannot.traces.analysis.partitions import IN_MEMORY_LAUNCHES
from autoannot.traces.progress import Progress

_PLAN: Any = None  # a pool process's plan (set once per pass by the pool's initializer)


def _set_plan(blob: bytes) -> None:
    """A pool process's plan, from its pickle (pickled once by the driver; unpickled by each
    process as it starts, side by side: a plan handed as an object is unpickled while the
    driver waits on each process's start in turn)."""
    import pickle

    global _PLAN
    _PLAN = pickle.loads(blob)


def _timed(function: Callable[..., Any], plan: Any, item: Any) -> tuple[float, Any]:
    import time

    started = time.perf_counter()
    found = function(plan, item)
    return time.perf_counter() - started, found


def _call(function: Callable[..., Any], item: Any) -> tuple[float, Any]:
    return _timed(function, _PLAN, item)


def said(label: str, seconds: list[float], wall: float) -> None:
    """One line on stderr for a pass: its tasks, the wall time, each task's own time."""
    import statistics
    import sys

    if seconds:
        print(f"autoannot: {label}: {len(seconds)} tasks in {wall:.1f} s; a task "
              f"{statistics.median(seconds):.2f} s (median), {max(seconds):.2f} s (most)",
              file=sys.stderr)


_PLANS: dict[str, Any] = {}  # a Dask worker's plan, by token (this pass's)


def _call_with(shipped: tuple[str, bytes], function: Callable[..., Any],
               item: Any) -> tuple[float, Any]:
    """``function(plan, item)`` on a Dask worker: the plan unpickled once per worker (it is
    shipped as one blob: thousands of small arrays as Dask's frames cost seconds each)."""
    import pickle

    token, blob = shipped
    plan = _PLANS.get(token)
    if plan is None:
        _PLANS.clear()  # (one pass at a time: its plan replaces the last)
        plan = _PLANS[token] = pickle.loads(blob)
    return _timed(function, plan, item)


#: A job of up to this many launches is analysed in this process unless ``-j`` says
#: otherwise: whole, as one partition with each file read once (``passes.index_in_memory``),
#: it needs no pass over the files before the matching, which a pool would share out.
IN_PROCESS_LAUNCHES = IN_MEMORY_LAUNCHES


class Embedded:
    """This machine: the tasks in this process (``jobs`` 1, or a small job where ``jobs`` was
    not given) or on a pool of ``jobs`` fresh processes (each holds the plan and one task's
    data at a time)."""

    name = "embedded"

    def __init__(self, jobs: int | None = None, progress: bool = False) -> None:
        from autoannot.traces.parallel import default_jobs

        self.jobs = jobs or default_jobs()
        self.chosen = jobs is not None  # (given: a pool of them whatever the job's size)
        self.progress = progress

    def in_process(self, plan: Any, items: int | None = None) -> bool:
        """Whether work on ``plan`` (``items`` tasks) runs in this process: one job, a job
        too small for a pool's start-up (unless jobs were given), or sources that only this
        process can read."""
        jobs = self.jobs if items is None else min(self.jobs, items)
        if not self.chosen and plan.launches() <= IN_PROCESS_LAUNCHES:
            jobs = 1
        return jobs <= 1 or not plan.all_files()

    def map(self, function: Callable[..., Any], plan: Any, items: Sequence[Any],
            label: str) -> list[Any]:
        import time

        started = time.perf_counter()
        shown = Progress(len(items) if self.progress else 0)
        jobs = min(self.jobs, len(items))
        timed: list[tuple[float, Any]] = []
        if self.in_process(plan, len(items)):
            for item in items:
                timed.append(_timed(function, plan, item))
                shown.step(label)
        else:
            import multiprocessing

            from autoannot.traces.parallel import pool, submit_all

            # (fresh processes: a forked child would share, and count again, the driver's
            # arrays)
            context = multiprocessing.get_context("forkserver" if os.name == "posix"
                                                  else "spawn")
            import pickle

            blob = pickle.dumps(plan, pickle.HIGHEST_PROTOCOL)
            with pool(jobs, context, _set_plan, (blob,)) as workers:
                futures = submit_all(workers, _call, items, function)
                for future in futures:
                    timed.append(future.result())
                    shown.step(label)
        if self.progress and len(items) > 1:
            said(label, [t for t, _ in timed], time.perf_counter() - started)
        return [found for _, found in timed]

    def close(self) -> None:
        pass


class Dask:
    """A Dask cluster: the scheduler at ``address`` (``DASK_SCHEDULER_ADDRESS`` where not
    given), or a local cluster of ``workers`` processes of ``memory_limit`` each. Every
    worker must see the rows files at the paths given."""

    name = "dask"

    def in_process(self, plan: Any, items: int | None = None) -> bool:
        """Never: every task runs on the cluster's workers."""
        return False

    def __init__(self, address: str | None = None, workers: int | None = None,
                 memory_limit: str | None = None, progress: bool = False) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            from autoannot.traces import files

            raise files.TraceError("the Dask engine needs Dask's distributed scheduler: pip "
                                   "install 'autoannot[dask]'") from None
        address = address or os.environ.get("DASK_SCHEDULER_ADDRESS")
        self.progress = progress
        self.cluster = None
        if address:
            self.client = Client(address)
        else:
            self.cluster = LocalCluster(n_workers=workers or 4, threads_per_worker=1,
                                        processes=True, memory_limit=memory_limit or "auto",
                                        dashboard_address=":0")
            self.client = Client(self.cluster)
        if progress and self.client.dashboard_link:  # (Dask's own view of the run)
            import sys

            print(f"autoannot: Dask's dashboard: {self.client.dashboard_link}", file=sys.stderr)

    def map(self, function: Callable[..., Any], plan: Any, items: Sequence[Any],
            label: str) -> list[Any]:
        import pickle
        import uuid

        from distributed import as_completed

        from autoannot.traces import files

        shipped = (uuid.uuid4().hex, pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL))
        shared = self.client.scatter(shipped, broadcast=True, hash=False)
        futures = self.client.map(_call_with, [shared] * len(items),
                                  [function] * len(items), list(items), pure=False)
        shown = Progress(len(items) if self.progress else 0)
        import time

        started = time.perf_counter()
        try:
            for _ in as_completed(futures):
                shown.step(label)
            timed = self.client.gather(futures)
            if self.progress:
                said(label, [t for t, _ in timed], time.perf_counter() - started)
            return [found for _, found in timed]
        except files.TraceError:
            raise
        except Exception as exc:  # (a task's error, or workers lost past Dask's retries)
            raise files.TraceError(f"the Dask run failed while {label} ({type(exc).__name__}: "
                                   f"{exc}): nothing written") from None
        finally:
            self.client.cancel([*futures, shared])

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def make(name: str = "embedded", jobs: int | None = None, address: str | None = None,
         workers: int | None = None, memory_limit: str | None = None,
         progress: bool = False) -> Embedded | Dask:
    """The engine a command asked for."""
    if name == "dask":
        return Dask(address, workers, memory_limit, progress)
    return Embedded(jobs, progress)

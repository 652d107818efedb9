"""Trace work over many files on all cores: results in the order of the files, one progress
line for all of them."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from autoannot.traces.progress import Progress

if TYPE_CHECKING:  # (imported where a pool is made: not by every command)
    from concurrent.futures import ProcessPoolExecutor

T = TypeVar("T")
R = TypeVar("R")


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _worker_start(command: int, initializer: Callable[..., Any] | None,
                  initargs: tuple[Any, ...]) -> None:
    """A pool process's start: Ctrl-C is the command's to handle (the terminal sends SIGINT to
    every process of the command, its workers too: each would print a traceback); the process
    leaves with the command (process ``command``), however the command ends; then
    ``initializer``."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _leave_with(command)
    if initializer is not None:
        initializer(*initargs)


def _leave_with(command: int) -> None:
    """End this process as soon as process ``command`` has ended (a thread waits on it): a
    worker of a command that was interrupted or killed is left behind by no one (it would wait
    for work forever, holding the command's output open)."""
    import threading

    def wait() -> None:
        try:
            import select

            fd = os.pidfd_open(command)  # (Linux: readable once the process has ended)
            select.select([fd], [], [])
        except (AttributeError, OSError):  # elsewhere, or already gone: look every second
            while True:
                try:
                    os.kill(command, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    pass
                time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=wait, name="autoannot-leave-with-command", daemon=True).start()


def submit_all(executor: ProcessPoolExecutor, function: Callable[..., Any],
               items: Sequence[Any], *before: Any) -> list[Any]:
    """``executor.submit(function, *before, item)`` for each item, with Ctrl-C held back
    meanwhile: the pool's processes (and a forkserver) start here, and inherit the held-back
    signal, so a Ctrl-C while they import cannot reach them; it reaches the command as soon
    as they are started."""
    import signal

    if not hasattr(signal, "pthread_sigmask"):  # (not on Unix: as it is)
        return [executor.submit(function, *before, item) for item in items]
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return [executor.submit(function, *before, item) for item in items]
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


#: Set by the ``autoannot`` command (``cli.run``): once interrupted, its process leaves within
#: this many seconds whatever its pool's teardown or Python's exit waits on (a Ctrl-C'd
#: ``report`` was seen left running, about one run in a hundred). None, as in a library
#: caller's process (a notebook's kernel): never ended by us.
LEAVE_AFTER_INTERRUPT_S: float | None = None


def leave_after_interrupt() -> None:
    """Where the command set ``LEAVE_AFTER_INTERRUPT_S``: end the process that long from now
    (exit status 130), unless it has ended by then."""
    if LEAVE_AFTER_INTERRUPT_S is None:
        return
    import threading

    def leave() -> None:
        sys.stderr.flush()
        os._exit(130)

    timer = threading.Timer(LEAVE_AFTER_INTERRUPT_S, leave)
    timer.daemon = True
    timer.start()


def _quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (where it is not running) with its stderr
    on the null device: a command that leaves after an interrupt (``leave_after_interrupt``)
    ends before its pool's semaphores are released, and the tracker, which releases them,
    would print a warning of them on the command's stderr after its last line."""
    from multiprocessing import resource_tracker

    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        resource_tracker.ensure_running()  # (passes it the stderr it has now)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


#: What a pool's process needs imported, imported once in the forkserver that starts them.
WORKERS_IMPORT = ("numpy", "autoannot.traces.analysis.passes")
#: glibc's allocator, in the processes the command starts: freed memory kept for the next
#: task's arrays (not handed back to the system and faulted in again, page by page: a
#: partition's task allocates a few hundred MB of arrays, and a fault costs microseconds on
#: a virtual machine). A user's own GLIBC_TUNABLES is left as it is.
WORKERS_ALLOCATOR = ("glibc.malloc.mmap_threshold=4294967295:"
                     "glibc.malloc.trim_threshold=4294967295")


_WORKERS_ENVIRONMENT: dict[str, str] = {}  # (set by ``prepare_workers``: the command's)


def prepare_workers() -> None:
    """The ``autoannot`` command's pools: each process forked from a forkserver that
    imported what they need once (``WORKERS_IMPORT``: about 0.3 s less a pool), with glibc's
    allocator keeping freed memory (``WORKERS_ALLOCATOR``: the matching about 15% faster at
    8,192 x 20,000). Set by the command alone: the forkserver's preload list is the
    process's, which a library caller's program may set for its own pools; the variable
    reaches the forkserver alone (``_start_forkserver``), not what else the command starts."""
    if os.name == "posix":
        import multiprocessing

        multiprocessing.get_context("forkserver").set_forkserver_preload(list(WORKERS_IMPORT))
        if sys.platform.startswith("linux") and "GLIBC_TUNABLES" not in os.environ:
            _WORKERS_ENVIRONMENT["GLIBC_TUNABLES"] = WORKERS_ALLOCATOR


def _start_forkserver() -> None:
    """The forkserver started (where it is not) with ``_WORKERS_ENVIRONMENT`` (read by glibc
    as a process starts; its pools' processes are forked from it), the command's own
    environment as it was."""
    import signal
    from multiprocessing import forkserver

    saved = {name: os.environ.get(name) for name in _WORKERS_ENVIRONMENT}
    os.environ.update(_WORKERS_ENVIRONMENT)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # (as ``submit_all``)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def pool(jobs: int, context: Any = None, initializer: Callable[..., Any] | None = None,
         initargs: tuple[Any, ...] = ()) -> Iterator[ProcessPoolExecutor]:
    """A pool of ``jobs`` processes that leaves with the command: where the command is
    interrupted (Ctrl-C) or fails, its queued tasks are dropped and its processes end with the
    task they run, with nothing printed by them."""
    from concurrent.futures import ProcessPoolExecutor

    if LEAVE_AFTER_INTERRUPT_S is not None:
        _quiet_resource_tracker()
    if _WORKERS_ENVIRONMENT and context is not None \
            and context.get_start_method() == "forkserver":
        _start_forkserver()
    executor = ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_start,
                                   initargs=(os.getpid(), initializer, initargs))
    try:
        yield executor
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            leave_after_interrupt()
        # The queued tasks are dropped; a task under way ends, and its process with it. Not
        # terminated: a worker killed while it sends its result leaves half a message in the
        # result pipe, which the pool's manager thread then waits on for ever (and Python's
        # exit waits on that thread: an interrupted report was seen left running).
        executor.shutdown(wait=False, cancel_futures=True)
        raise
    executor.shutdown(wait=True)


def map_files(function: Callable[[T], R], items: Sequence[T], jobs: int | None = None,
              label: str = "", name: Callable[[T], object] = str, show: bool = True,
              outcome: Callable[[R], str] | None = None) -> Iterator[R]:
    """``function(item)`` for each item, on up to ``jobs`` processes (default: the cores),
    yielded in the order of ``items``. One process (or one item): no pool at all.
    ``function`` must be picklable (a module-level function). The progress line says
    ``label`` of each item, or ``outcome(result)`` where given (``"failed"``, ...)."""
    jobs = min(jobs or default_jobs(), len(items))
    progress = Progress(len(items) if show else 0)
    if jobs <= 1:
        for item in items:
            result = function(item)
            progress.step(f"{outcome(result) if outcome else label} {name(item)}")
            yield result
        return
    with pool(jobs) as workers:
        futures = submit_all(workers, function, items)
        for item, future in zip(items, futures, strict=True):
            result: Any = future.result()
            progress.step(f"{outcome(result) if outcome else label} {name(item)}")
            yield result

"""``AUTOANNOT_RECORD=PATH``: one JSON line per collective launch, written as the launch is
entered, before it runs.

So the file always ends with what each rank last entered: a collective that hangs is there, on
the ranks that entered it, whatever ends the job (SIGTERM from torchrun, SIGKILL, ``os._exit``).
Each line is one ``write()`` to a file opened for appending, under a lock: nothing is buffered,
lines from threads never mix, and a line is in the file (the kernel's page cache) before the
collective starts.

A line::

    {"rank": 0, "pid": 4242, "host": "node17", "run": "20261201T143000-1f3a9c2e",
     "monotonic_ns": 81630154123,
     "wall_ns": 1796135400123456789, "group": "0", "seq": 17, "api": "all_reduce",
     "call_site": "/job/train.py:88", "annotation": {...}, "param_comms": {...}}

``rank``: the process's rank (torch.distributed's when initialized, else ``RANK``, else null);
``host``: the machine's name (ranks of one host share its monotonic clock);
``run``: the job's run, the same on every rank of one run of a job and different for the next
(see ``run_identity``): the tools never put two runs side by side;
``monotonic_ns``: ``time.monotonic_ns()`` (one clock for all processes of a host, none across
hosts);
``wall_ns``: ``time.time_ns()`` at the same moment (the wall clock: a trace's own time base);
``group``: the process group's name ("Process Group Name"; "" for point-to-point blocks);
``seq``: how many launches this process entered on that group before this one (0, 1, ...):
the same collective has the same ``seq`` on every member rank; ``annotation``: what the
annotation context was given; ``param_comms``: the eager ``record_param_comms`` op's args.

``{rank}``, ``{pid}`` and ``{host}`` in the path are filled in when the first line is
written. A missing folder is created, and that is said on stderr (a typo shows at once). A file
that exists is appended to: a second run of a job with the same path adds its lines, each
carrying its run, and the tools read each run apart.

A path that would be every rank's (``AUTOANNOT_RECORD`` with no ``{rank}`` or ``{pid}``, in a
job of several ranks) is made each rank's own: ``all.jsonl`` becomes ``all.rank3.jsonl`` (said
once, by rank 0). Ranks on several hosts appending to one file on a shared file system can lose
or mix lines, and a file per rank is what a hang's forensics needs: each rank's last line.
"""

from __future__ import annotations

import os
import sys
import time

from autoannot.base import locks

TYPE_CHECKING = False  # imported at start-up (AUTOANNOT_RECORD): typing and json cost ms
if TYPE_CHECKING:
    from typing import Any

PG_NAME = "Process Group Name"  # vocabulary.PG_NAME

FIELDS = ("rank", "pid", "host")


class JournalError(ValueError):
    """An ``AUTOANNOT_RECORD`` value that cannot name a file."""


def check_template(template: str) -> None:
    """Raise JournalError unless ``template`` names a file, with only ``{rank}``, ``{pid}`` and
    ``{host}`` to fill in."""
    if not template.strip():
        raise JournalError("AUTOANNOT_RECORD is empty")
    import _string

    try:
        names = [name for _, name, _, _ in _string.formatter_parser(template) if name is not None]
    except ValueError as exc:
        raise JournalError(f"AUTOANNOT_RECORD={template!r}: {exc}") from None
    unknown = sorted({name for name in names if name not in FIELDS})
    if unknown:
        raise JournalError(f"AUTOANNOT_RECORD={template!r}: unknown field "
                           f"{', '.join('{' + n + '}' for n in unknown)} (known: "
                           f"{', '.join('{' + n + '}' for n in FIELDS)})")
    if template.endswith(("/", os.sep)):
        raise JournalError(f"AUTOANNOT_RECORD={template!r} names a folder: give a file")


class Journal:
    """The ``AUTOANNOT_RECORD`` file of this process (see the module docstring)."""

    #: (it writes each launch's entry alone: the sink does not tell it of returns)
    finishes = False

    def __init__(self, template: str, inherited: bool = False) -> None:
        check_template(template)
        self.template = template
        #: Whether every process of the job was given the same template (``AUTOANNOT_RECORD``
        #: in their environment): one with no ``{rank}`` is then made each rank's own.
        self.inherited = inherited
        self.path: str | None = None  # once opened
        self._fd: int | None = None
        self._rank: int | None = None
        self._seq: dict[str, int] = {}
        self._run = '""'  # (its JSON text, once the file is opened)
        self._host = '""'  # (likewise)
        #: (id(annotation), id(cpu_only)) -> (annotation, cpu_only, their JSON): the records
        #: of one distinct launch share those dicts (never mutated).
        self._texts: dict[tuple[int, int], tuple[Any, Any, str]] = {}
        self._lock = locks.renewed(self, "_lock")  # (a journal lives as long as the process)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.after_fork_in_child)

    def __repr__(self) -> str:
        return f"Journal({self.path or self.template!r})"

    @property
    def run(self) -> str | None:
        """The run its lines name (None before the first line)."""
        import json

        return json.loads(self._run) or None

    def _open(self) -> int:
        import atexit
        import socket

        dist = sys.modules.get("torch.distributed")
        self._rank = process_rank(dist)
        path = self.template.format(rank="" if self._rank is None else self._rank,
                                    pid=os.getpid(), host=socket.gethostname())
        world = _world_size(dist)
        shared = self.inherited and world > 1 and shared_by_ranks(self.template)
        if shared:
            path = own_path(path, self._rank)
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            os.makedirs(folder, exist_ok=True)
            sys.stderr.write(f"autoannot: created {folder} for AUTOANNOT_RECORD's file\n")
        self.path = path
        self._run = _quote(run_identity(dist))
        self._host = _quote(socket.gethostname())
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        atexit.register(self.close)
        if shared and not self._rank:
            sys.stderr.write(
                f"autoannot: AUTOANNOT_RECORD={self.template!r} would be one file for the "
                f"job's {world} ranks (it has no {{rank}} or {{pid}}): each rank writes its "
                f"own instead, {own_path(self.template, '{rank}')}\n")
        return fd

    def enter(self, entry: Any) -> None:
        """Write one line for a launch about to run."""
        group = entry.annotation.get(PG_NAME, "")
        with self._lock:
            fd = self._fd
            if fd is None:
                fd = self._fd = self._open()
            seq = self._seq.get(group, 0)
            self._seq[group] = seq + 1
            rank = "null" if self._rank is None else self._rank
            line = (f'{{"rank": {rank}, "pid": {os.getpid()}, "host": {self._host}, '
                    f'"run": {self._run}, '
                    f'"monotonic_ns": {time.monotonic_ns()}, "wall_ns": {time.time_ns()}, '
                    f'"group": {_quote(str(group))}, '
                    f'"seq": {seq}, "api": {_quote(entry.api)}, '
                    f'"call_site": {_quote(entry.call_site)}, {self._text(entry)}')
            data = line.encode()
            while data:
                data = data[os.write(fd, data):]

    def _text(self, entry: Any) -> str:
        annotation, cpu_only = entry.annotation, entry.cpu_only
        key = (id(annotation), id(cpu_only))
        known = self._texts.get(key)
        if known is None or known[0] is not annotation or known[1] is not cpu_only:
            if len(self._texts) >= 4096:
                self._texts.clear()
            import json

            text = (f'"annotation": {json.dumps(annotation)}, '
                    f'"param_comms": {json.dumps(entry.param_comms)}}}\n')
            known = self._texts[key] = (annotation, cpu_only, text)
        return known[2]

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def after_fork_in_child(self) -> None:
        """The child writes its own lines (its own file where the path has ``{pid}``), with its
        own sequence numbers."""
        fd, self._fd = self._fd, None
        self._seq = {}
        if fd is not None:
            try:  # noqa: SIM105 (contextlib costs start-up time)
                os.close(fd)
            except OSError:
                pass


def shared_by_ranks(template: str) -> bool:
    """Whether a record path would be the same file for every rank of a job: it has neither
    ``{rank}`` nor ``{pid}``, nor ``{host}`` with one process a host (torchrun's
    ``LOCAL_WORLD_SIZE``)."""
    import _string

    names = {name for _, name, _, _ in _string.formatter_parser(template) if name}
    if names & {"rank", "pid"}:
        return False
    return not ("host" in names and os.environ.get("LOCAL_WORLD_SIZE") == "1")


def own_path(path: str, rank: object) -> str:
    """``path`` made one rank's: ``run/all.jsonl`` -> ``run/all.rank3.jsonl`` (the process id
    where no rank is known)."""
    mark = f"rank{rank}" if rank is not None else f"pid{os.getpid()}"
    folder, name = os.path.split(path)
    stem, dot, suffix = name.rpartition(".")
    name = f"{stem}.{mark}.{suffix}" if dot and stem else f"{name}.{mark}"
    return os.path.join(folder, name)


def process_rank(dist: Any) -> int | None:
    """This process's rank: torch.distributed's where it is initialized, else ``RANK``, else
    None."""
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    value = os.environ.get("RANK", "")
    return int(value) if value.isdigit() else None


def _world_size(dist: Any) -> int:
    """The job's ranks: the process group's, else ``WORLD_SIZE``, else 1."""
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:  # (a group torn down under us: the environment's word, below)
        pass
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() else 1


#: The key under which the ranks of one run agree on its identity (the job's c10d store).
RUN_KEY = "autoannot/run"


def run_identity(dist: Any = None) -> str:
    """The run this process belongs to, the same on every rank of one run of a job: torchrun's
    ``TORCHELASTIC_RUN_ID`` where it names one; else the first of the ranks to ask writes its
    own (start time and a random part) to the job's c10d store, and every rank reads that one;
    else (no process group) this process's own (host, pid, start)."""
    import socket

    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic != "none":
        return f"torchelastic:{elastic}"
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    mine = f"{stamp}-{os.urandom(4).hex()}"
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            store = dist.distributed_c10d._get_default_store()
            agreed = store.compare_set(RUN_KEY, "", mine)
            return agreed.decode() if isinstance(agreed, bytes) else str(agreed)
    except Exception:  # a store that cannot compare-and-set: this process's own, below
        pass
    return f"{socket.gethostname()}:{os.getpid()}:{mine}"


def _quote(text: str) -> str:
    """``json.dumps`` of a string, without its Python-level overhead."""
    import json.encoder

    global _quote
    _quote = json.encoder.encode_basestring_ascii  # type: ignore[assignment]
    return _quote(text)


def open_from_environment(state: Any) -> Journal | None:
    """The journal ``AUTOANNOT_RECORD`` asks for, opened in ``state`` (the agent's: lines go
    to it); None if unset. A value that cannot name a file is said on stderr, once; the job
    runs without it."""
    from autoannot.base import config

    template = config.record_template()
    if template is None:
        return None
    try:
        journal = Journal(template, inherited=True)
    except JournalError as exc:
        sys.stderr.write(f"autoannot: {exc}: no record file is written\n")
        return None
    state.open_journal(journal)
    return journal

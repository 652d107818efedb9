"""``AUTOANNOT_RING=FOLDER``: the always-on recorder. Each rank keeps its last N collective
launches (``AUTOANNOT_RING_LAUNCHES``, default 65,536) in a file of fixed-size records mapped
into its memory: a launch is written with no system call and no JSON, and what the rank last
entered is in the file whatever ends the process (SIGKILL included: the pages are the
kernel's), where a watcher on the same host reads it while the job runs.

Two files a rank, ``rank{R}.ring`` and beside it ``rank{R}.ring.names``:

* ``.ring``: a 64-byte header, then ``capacity`` records of 48 bytes. The header: ``MAGIC``,
  the record size and capacity (``<II``), and how many launches were entered so far
  (``<Q`` at ``COUNT_AT``, written after each record). Launch ``i`` (0, 1, ...) is the
  record at ``i % capacity``: its group's seq, its entry, return and completion times
  (``time.monotonic_ns()``; return 0 while it runs, ``FAILED`` where it raised; completion
  0 where unknown), its kind and its call site (ids into the names file), and the thread its
  completion was told on (0 where unknown): ``RECORD`` (``<qqqqIII4x``).
* ``.ring.names``: one JSON line for the ring (``{"ring": 1, "rank", "pid", "host", "run",
  "capacity", "record_bytes", "monotonic_ns", "wall_ns"}``: the two clocks read at one
  moment), then a line for each kind and call site the first time one is seen
  (``{"kind": K, "api", "group", "annotation", "param_comms"}``, ``{"site": S, "call_site"}``):
  a ``write()`` for a launch of a kind or from a line not seen before, none after. A kind of a
  graph replay's launches also says the graph (``"graph": "autoannot.graph.N"``).

A replay of a captured graph (``replayed``: the agent's ``CUDAGraph.replay`` wrapper, while a
ring with files is open) writes a record for each launch of the graph's ledger, in capture
order: each its group's next seq, all entered when ``replay()`` was called and returned when
it returned (the graph's launch on the CPU; its kernels run later, on the GPU).

A launch's return time is when the call returned: for a collective that blocks (gloo's, and
any ``async_op=False`` call on the CPU) its completion; for one that returns a Work or runs on
a GPU stream, when it was issued. Its completion time is written for a launch that returned a
Work whose result lies on the CPU (gloo's ``async_op=True``), by a ring that asks for it
(``completions``: a profiler's window, not the always-on ring: a callback costs ~50 us a
launch): when the Work's future ran its callbacks (``Future.add_done_callback``, torch's
public way to be told), with the thread that ran them: gloo completes a Work on the worker
thread that ran it, the thread the profiler shows its range on, which is what tells two async
launches of a group apart when gloo's two worker threads ran them out of order.

A native writer (``native/ring_hooks.cpp``, where the native module is built) may be attached
to a ring with files (``use_writer``, ``attach_writer``): from then on its records are written in
C++ — by the proxies' C wrappers (a launch of a key and call site seen before), by the Python
wrappers through it, and by the process-group hooks directly (torch >= 2.14) — with one counter;
Python keeps the kinds' and call sites' ids (``ids_of``, ``site_id``, which the writer asks once
a site), and numbers the groups for it (their slots).

``Ring(None)``: a ring held in memory alone (no files; ``held()`` reads it): what the agent
keeps of a profiler's window (``keep.window``).
"""

from __future__ import annotations

import os
import struct
import sys
import time
from _thread import get_ident, get_native_id

from autoannot.base import locks
from autoannot.base.diagnostics import warn_once
from autoannot.base.ring_format import (
    COUNT,
    COUNT_AT,
    DEFAULT_LAUNCHES,
    FAILED,
    FINISHED,
    FINISHED_AT,
    FINISHED_THREAD_AT,
    HEADER,
    MAGIC,
    NAMES_SUFFIX,
    RECORD,
    RETURNED,
    RETURNED_AT,
    SUFFIX,
    THREAD,
    put_record,
    ring_bytes,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PG_NAME = "Process Group Name"  # vocabulary.PG_NAME


class Ring:
    """This process's ring (see the module docstring), opened at its first launch (the rank is
    known then). Registered with the agent's state as a journal: the sink hands it every launch
    as it is entered (``enter``) and as it returns (``returned``) or raises (``failed``)."""

    #: The sink tells it of each launch's return (a record file's journal is not told).
    finishes = True
    #: (not a record file: ``export`` joins the rows of a trace with a record file's lines)
    path = None
    #: The proxies' wrappers hand it their launches inline (``enter_kind``), not through the
    #: sink's ``run``.
    inline = True
    #: It keeps every launch, those made from C++ too (the native observer then watches the
    #: operators, as for a recorder: on a GPU host a record file asks for NCCL's own records
    #: alone, and DDP's gloo launches would go unwritten).
    every_launch = True

    def __init__(self, folder: str | None, capacity: int = DEFAULT_LAUNCHES,
                 per_run: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"a ring of {capacity} launches")
        self.folder = folder
        #: Its folder is its run's under ``base.run_folders`` (``folder``: theirs), known at
        #: its opening (where the ranks agree on their run).
        self.per_run = per_run
        self.capacity = capacity
        self.ring_path: str | None = None  # once opened
        self.rank: int | None = None
        self._map: Any = None
        self._names_fd: int | None = None
        self._count = 0
        self._seq: dict[str, int] = {}
        self._kinds: dict[tuple[int, int], tuple[Any, Any, int]] = {}
        self._sites: dict[str, int] = {}
        self._running: dict[int, int] = {}  # thread -> offset of the record it runs
        self._lock = locks.renewed(self, "_lock")
        self._opened_by: int | None = None  # the process that opened it
        self._by_kind: dict[int, tuple[Any, int, str]] = {}  # id(Kind) -> (it, its id, group)
        self._writer: Any = None  # the native writer, while attached (``use_writer``)
        self._slots: dict[str, int] = {}  # group -> its slot in the writer's seqs
        self.on_open: list[Any] = []  # called with the ring once it is opened
        self._closed = False
        self.names: list[dict[str, Any]] | None = [] if folder is None else None  # (in memory)
        #: Whether it asks each Work for its completion (a callback on gloo's worker thread:
        #: ~50 us an async launch, the GIL handed over twice): a profiler's window does (its
        #: rows pair gloo's ranges by it); the always-on ring does not.
        self.completions = folder is None
        #: Whether it keeps each replay of a captured graph (``replayed``): the always-on
        #: ring does; a profiler's window does not (its trace has the replays' kernels, which
        #: the ledgers name).
        self.replays = folder is not None
        #: A graph's ledger name -> (its entries, how many were planned, each one's (kind,
        #: site, group)): what a replay writes; and with the writer attached, their ids
        #: packed for it (``_replay_ids``, by name: the attach they were packed for, the ids).
        self._replay_plans: dict[str, tuple[list[Any], int, list[tuple[int, int, str]]]] = {}
        self._replay_ids: dict[str, tuple[int, bytes]] = {}
        self._attaches = 0  # (one more at each writer attached: slots are an attach's)
        #: What times its launches on the GPU (``keep.gpu_clock``: the source of events), for a
        #: ring with files in a process that has CUDA and did not turn it off; else None. The
        #: clock is made at the first launch it times (``gpu``). A ring that times the GPU
        #: writes its records in Python (no native writer is attached to it).
        self.gpu_source: Any = None
        self.gpu: Any = None
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)

    def __repr__(self) -> str:
        return f"Ring({self.ring_path or self.folder!r}, {self.capacity})"

    @property
    def count(self) -> int:
        """How many launches it entered so far."""
        writer = self._writer
        count = -1 if writer is None else writer.ring_count()
        return self._count if count < 0 else count

    @property
    def writer(self) -> Any:
        """The native writer attached (None: records are written in Python)."""
        return self._writer

    def use_writer(self, writer: Any) -> bool:
        """Write this ring's records with ``writer`` (the native module) from now on; whether
        it is attached (a ring with files, open, and none attached yet)."""
        with self._lock:
            if (self._map is None or self.folder is None or self._writer is not None
                    or self.gpu_source is not None
                    or writer.ring_count() >= 0):  # (it writes one ring: another has it)
                return False
            groups = list(self._seq)
            writer.ring_attach(self._map, self.capacity, self._count,
                               [self._seq[group] for group in groups], self.site_id)
            self._slots = {group: slot for slot, group in enumerate(groups)}
            self._running = {}
            self._writer = writer
            self._attaches += 1
            return True

    def attach_writer(self, writer: Any) -> bool:
        """Whether ``writer`` (the native module) writes this ring's records: attached now
        if it can be (a ring with files, opened first if need be; the writer free)."""
        if self._writer is writer:
            return True
        return self.folder is not None and self.open_now() and self.use_writer(writer)

    def open_now(self) -> bool:
        """Open the ring before its first launch (a writer is attached to an open ring);
        whether it is open."""
        with self._lock:
            return self._map is not None or self._opened()

    def _let_go_of_writer(self) -> None:
        """(Under the lock) the writer detached: Python writes the records again, from where
        it left them."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        told = writer.ring_detach()
        if told is not None:
            count, seqs = told
            self._count = count
            self._seq = {group: seqs[slot] if slot < len(seqs) else 0
                         for group, slot in self._slots.items()}
        self._slots = {}

    def _slot(self, group: str) -> int:
        """(Under the lock, attached) a group's slot in the writer's seqs."""
        slot = self._slots.get(group)
        if slot is None:
            slot = self._slots[group] = len(self._slots)
        return slot

    def ids_of(self, kind: Any) -> tuple[int, int] | None:
        """(Attached) the ids a launch of ``kind`` just entered was written with: its kind's
        and its group's slot; None if it was not."""
        known = self._by_kind.get(id(kind))
        if known is None or known[0] is not kind or self._writer is None:
            return None
        with self._lock:
            return known[1], self._slot(known[2])

    def site_id(self, site: str) -> int:
        """A call site's id in this ring (written to the names file the first time)."""
        with self._lock:
            return self._site_of(site)

    def _site_of(self, site: str) -> int:
        """(Under the lock) ``site_id``."""
        found = self._sites.get(site)
        if found is None:
            found = self._sites[site] = len(self._sites)
            self._write_names({"site": found, "call_site": site})
        return found

    def _open(self) -> None:
        import json
        import mmap
        import socket

        from autoannot.keep import journal

        dist = sys.modules.get("torch.distributed")
        self.rank = journal.process_rank(dist)
        size = ring_bytes(self.capacity)
        meta = {"ring": 1, "rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(),
                "run": journal.run_identity(dist), "capacity": self.capacity,
                "record_bytes": RECORD.size}
        if self.folder is None:  # held in memory alone
            self._map = mmap.mmap(-1, size)
            HEADER.pack_into(self._map, 0, MAGIC, RECORD.size, self.capacity)
            self.names = [{**meta, "monotonic_ns": time.monotonic_ns(),
                           "wall_ns": time.time_ns()}]
            self._opened_by = os.getpid()
            return
        if self.per_run and self._opened_by is None:
            self._open_run_folder(meta["run"])
        os.makedirs(self.folder, exist_ok=True)
        name = f"rank{self.rank}" if self.rank is not None else f"pid{os.getpid()}"
        if self._opened_by is not None and self.rank is not None:  # a forked child's own
            name += f".pid{os.getpid()}"
        stem = os.path.join(self.folder, name)
        fd = os.open(stem + SUFFIX, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        HEADER.pack_into(self._map, 0, MAGIC, RECORD.size, self.capacity)
        self._names_fd = os.open(stem + NAMES_SUFFIX,
                                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o666)
        self._write_names({**meta, "monotonic_ns": time.monotonic_ns(),
                           "wall_ns": time.time_ns()}, json)
        self.ring_path = stem + SUFFIX
        self._opened_by = os.getpid()
        for call in self.on_open:
            call(self)

    def _open_run_folder(self, run: str) -> None:
        """(At its opening) its run's folder under ``base.run_folders`` (made by the first of
        the host's ranks, which clears old runs' folders), said once in the job's log: by rank
        0, and by each host's first rank (``LOCAL_RANK`` 0)."""
        from autoannot.base import run_folders

        self.folder, _ = run_folders.make(run)
        if self.rank == 0 or os.environ.get("LOCAL_RANK") == "0":
            sys.stderr.write(
                f"autoannot: AUTOANNOT_RING unset: the ranks' rings are kept in {self.folder} "
                f"(this run's; `autoannot watch` reads the newest run's; the newest "
                f"{run_folders.KEEP_RUNS} runs' are kept, older ones removed)\n")

    def _open_anew(self) -> None:
        """Open the ring: at the first launch, or at a forked child's first (its own files,
        its own sequence numbers; the parent's mapping is left to the parent)."""
        if self._opened_by is not None:
            self._count, self._seq, self._running = 0, {}, {}
            self._kinds, self._sites, self._by_kind = {}, {}, {}
            self._replay_plans, self._replay_ids = {}, {}
        try:
            self._open()
        except OSError as exc:  # (no ring, said once; the launches go on, never retried)
            self._closed, self._map = True, None
            sys.stderr.write(f"autoannot: AUTOANNOT_RING: cannot keep a ring in {self.folder} "
                             f"({exc.strerror or exc}): no ring is kept\n")

    def _write_names(self, line: dict[str, Any], json: Any = None) -> None:
        if self.names is not None:  # (held in memory)
            self.names.append(line)
            return
        if json is None:
            import json
        data = (json.dumps(line) + "\n").encode()
        while data:
            data = data[os.write(self._names_fd, data):]  # type: ignore[arg-type]

    def _opened(self) -> bool:
        """(Under the lock, with no ring mapped) open it, unless it was closed; whether it is
        mapped now."""
        if not self._closed:
            self._open_anew()
        return self._map is not None

    def _forked(self) -> None:
        """(In a forked child) its first launch opens a ring of its own."""
        self._let_go_of_writer()
        self._map = None
        self.gpu = None  # (its thread is the parent's)

    def enter(self, entry: Any) -> None:
        """Write the record of a launch about to run (``entry``: a ``keep.records.Record``)."""
        group = entry.annotation.get(PG_NAME, "")
        with self._lock:
            if self._map is None and not self._opened():
                return
            self._write(self._kind_of(entry, group), entry.call_site, group)

    def enter_kind(self, kind: Any, site: str) -> None:
        """``enter`` of a launch of ``kind`` (``describe.kinds.Kind``) called from ``site``:
        the proxies' wrappers' inline path (no ``Record`` made but for a kind not seen
        before)."""
        try:  # (a failure of the ring's own is said once, never raised to a launch)
            known = self._by_kind.get(id(kind))
            with self._lock:
                ring = self._map
                if ring is not None and known is not None and known[0] is kind:
                    site_id = self._sites.get(site)
                    if site_id is not None:  # (``_write``, inlined: a call costs ~1.7k
                        group = known[2]  # instructions of the ~11k a record took)
                        writer = self._writer
                        if writer is not None:
                            slot = self._slots.get(group)
                            writer.ring_enter(known[1], site_id,
                                              self._slot(group) if slot is None else slot)
                            return
                        seqs = self._seq
                        seq = seqs.get(group, 0)
                        seqs[group] = seq + 1
                        count = self._count
                        at = put_record(ring, self.capacity, count, seq, _monotonic_ns(), 0,
                                        known[1], site_id)
                        self._count = count + 1
                        _pack_count(ring, COUNT_AT, count + 1)
                        self._running[get_ident()] = (at, count)
                        return
                if ring is None:
                    if not self._opened():
                        return
                    known = None
                if known is None or known[0] is not kind:
                    from autoannot.keep.records import new_record

                    entry = new_record(kind[0], kind[1], site, kind[2])
                    group = kind[1].get(PG_NAME, "")
                    if len(self._by_kind) >= 4096:
                        self._by_kind.clear()
                    known = self._by_kind[id(kind)] = (kind, self._kind_of(entry, group), group)
                self._write(known[1], site, known[2])
        except Exception as exc:
            warn_once(kind[0], "writing the launch to the ring", exc)

    def _write(self, kind: int, site_text: str, group: str) -> None:
        """(Under the lock) the record of a launch entered now."""
        site = self._sites.get(site_text)
        if site is None:  # (the lookup inline: a launch pays no call for a site seen before)
            site = self._site_of(site_text)
        if self._writer is not None:
            self._writer.ring_enter(kind, site, self._slot(group))
            return
        seq = self._seq.get(group, 0)
        self._seq[group] = seq + 1
        count = self._count
        at = put_record(self._map, self.capacity, count, seq, time.monotonic_ns(), 0, kind, site)
        self._count = count + 1
        COUNT.pack_into(self._map, COUNT_AT, count + 1)
        self._running[get_ident()] = (at, count)

    def _kind_of(self, entry: Any, group: str) -> int:
        annotation, cpu_only = entry.annotation, entry.cpu_only
        key = (id(annotation), id(cpu_only))
        known = self._kinds.get(key)
        if known is None or known[0] is not annotation or known[1] is not cpu_only:
            kind = len(self._kinds)
            self._write_names({"kind": kind, "api": entry.api, "group": str(group),
                               "annotation": annotation, "param_comms": entry.param_comms})
            known = self._kinds[key] = (annotation, cpu_only, kind)
        return known[2]

    def replayed(self, graph: str, entries: list[dict[str, Any]], entered_ns: int,
                 returned_ns: int) -> None:
        """A replay of the captured graph ``graph`` (its ledger's name), called at
        ``entered_ns`` and returned at ``returned_ns`` (``FAILED``: it raised): a record for
        each of ``entries`` (its ledger's launches, in capture order), each its group's next
        seq, entered and returned as the replay was (its kernels run later, on the GPU)."""
        with self._lock:
            if self._map is None and not self._opened():
                return
            plan = fresh = self._replay_plans.get(graph)
            if plan is None or plan[0] is not entries or plan[1] != len(entries):
                if len(self._replay_plans) >= 4096:
                    self._replay_plans.clear()
                    self._replay_ids.clear()
                plan = self._replay_plans[graph] = (entries, len(entries), [
                    self._replayed_kind(graph, i, entry, len(entries))
                    for i, entry in enumerate(entries)])
            writer = self._writer
            if writer is not None:
                ids = self._replay_ids.get(graph)
                if ids is None or ids[0] != self._attaches or plan is not fresh:
                    ids = self._replay_ids[graph] = (self._attaches, b"".join(
                        _REPLAY_IDS.pack(kind, site, self._slot(group))
                        for kind, site, group in plan[2]))
                writer.ring_write_many(ids[1], entered_ns, returned_ns)
                return
            ring, capacity, seqs, count = self._map, self.capacity, self._seq, self._count
            first = count
            for kind, site, group in plan[2]:
                seq = seqs.get(group, 0)
                seqs[group] = seq + 1
                put_record(ring, capacity, count, seq, entered_ns, returned_ns, kind, site)
                count += 1
            self._count = count
            _pack_count(ring, COUNT_AT, count)
        if self.gpu is not None and returned_ns != FAILED:
            try:
                self.gpu.replayed(graph, first, count - first, entered_ns)
            except Exception as exc:
                _gpu_said("a replay", exc)

    def _replayed_kind(self, graph: str, index: int, entry: dict[str, Any], of: int
                       ) -> tuple[int, int, str]:
        """(Under the lock) the ids of a replayed launch (the ``index``-th of the ``of`` of
        ``graph``'s ledger): a kind of its own, its names line saying the graph, its place in
        it, and its call site's."""
        from autoannot.keep.records import new_record

        annotation = entry["annotation"]
        group = str(annotation.get(PG_NAME, ""))
        kind = len(self._kinds)
        self._kinds[("replay", graph, index)] = (None, None, kind)  # type: ignore[index]
        self._write_names({"kind": kind, "api": entry["api"], "group": group,
                           "annotation": annotation, "graph": graph, "index": index, "of": of,
                           "param_comms": new_record(entry["api"], annotation,
                                                     entry["call_site"], {}).param_comms})
        return kind, self._site_of(entry["call_site"]), group

    def returned(self, failed: bool = False, result: Any = None) -> None:
        """The launch this thread entered last returned ``result`` (or raised: ``failed``).
        A Work's completion is written when its future runs its callbacks, if its result lies
        on the CPU."""
        try:  # (a failure of the ring's own is said once, never raised to a launch)
            writer = self._writer
            if writer is not None:  # (it keeps each thread's running record)
                writer.ring_returned(failed)
                return
            running = self._running.pop(get_ident(), None)
            ring = self._map
            if running is None or ring is None:
                return
            _pack_returned(ring, running[0] + RETURNED_AT, FAILED if failed else _monotonic_ns())
            if (self.completions and result is not None and not failed
                    and result.__class__ is _work_type()):
                result.get_future().add_done_callback(_Finished(self, running))
        except Exception as exc:
            warn_once("ring", "writing the launch's end to the ring", exc)

    def finished(self, running: tuple[int, int]) -> None:
        """The launch entered as ``running`` (its record's offset, its count) completed now,
        told on this thread, unless its record was written over since."""
        at, count = running
        ring = self._map
        if ring is not None and self._count - count < self.capacity:
            THREAD.pack_into(ring, at + FINISHED_THREAD_AT, get_native_id())
            FINISHED.pack_into(ring, at + FINISHED_AT, time.monotonic_ns())

    def gpu_started(self) -> Any:
        """The launch this thread entered last is about to be issued on a CUDA stream: its GPU
        start's event recorded (``keep.gpu_clock``); what to hand ``gpu_ended``, or None where
        it is not timed (failures said once)."""
        try:
            running = self._running.get(get_ident())
            if running is None:
                return None
            clock = self.gpu
            if clock is None:
                clock = self._gpu_clock()
                if clock is None:
                    return None
            return clock.started(running[1])
        except Exception as exc:
            _gpu_said("a launch's start", exc)
            return None

    def gpu_ended(self, started: Any, failed: bool, result: Any) -> None:
        """The launch ``started`` (``gpu_started``'s) returned ``result`` or raised: its end's
        event recorded where its stream waits for it (a call that returned no Work)."""
        clock = self.gpu
        if clock is None:  # (the ring closed while the launch ran)
            return
        try:
            if failed:
                clock.failed(started)
            else:
                clock.ended(started, result is None)
        except Exception as exc:
            _gpu_said("a launch's end", exc)

    def gpu_prepare_capture(self) -> None:
        """A capture is about to begin: where this ring times the GPU, its clock made and
        ready for the capture's launches (their stamps); failures said once."""
        try:
            source = self.gpu_source
            if source is None:
                return
            decide = getattr(source, "decide", None)
            if decide is not None and not decide():
                return
            clock = self.gpu or self._gpu_clock()
            if clock is not None:
                clock.prepare_capture()
        except Exception as exc:
            _gpu_said("a capture's stamps", exc)

    def _gpu_clock(self) -> Any:
        """(At the first timed launch) the GPU clock, its file beside the ring."""
        from autoannot.base.ring_format import GPU_SUFFIX
        from autoannot.keep.gpu_clock import GpuClock

        with self._lock:
            if self.gpu is None and self.ring_path is not None and self.gpu_source is not None:
                source = self.gpu_source() if callable(self.gpu_source) else self.gpu_source
                self.gpu_source = source
                self.gpu = GpuClock(self.ring_path[:-len(SUFFIX)] + GPU_SUFFIX, self.capacity,
                                    source)
            return self.gpu

    def held(self) -> tuple[bytes, list[dict[str, Any]]] | None:
        """(A ring held in memory) its bytes and names, as a reader reads a ring's files;
        None before its first launch."""
        with self._lock:
            if self._map is None or self.names is None:
                return None
            return bytes(self._map), list(self.names)

    def close(self) -> None:
        """Unmap the ring (its file stays); no launch is written after."""
        with self._lock:
            self._closed = True
            self._let_go_of_writer()
            clock, self.gpu, self.gpu_source = self.gpu, None, None
            ring, self._map = self._map, None
            fd, self._names_fd = self._names_fd, None
        if clock is not None:
            clock.close()
        if ring is not None:
            ring.flush()
            ring.close()
        if fd is not None:
            os.close(fd)


#: Bound once: a record's hot path reads module globals, not attributes of ``struct``/``time``.
_pack_count = COUNT.pack_into
_pack_returned = RETURNED.pack_into
_monotonic_ns = time.monotonic_ns
#: A replayed launch's ids as the native writer's ``ring_write_many`` reads them: kind, site,
#: its group's slot.
_REPLAY_IDS = struct.Struct("<III")

_WORK: list[Any] = []


def _work_type() -> Any:
    """torch's ``Work`` class (what an ``async_op=True`` collective returns)."""
    if not _WORK:
        dist = sys.modules.get("torch.distributed")
        _WORK.append(getattr(dist, "Work", None))
    return _WORK[0]


class _Finished:
    """A Work's future's callback: the ring's record of its launch completed, if the Work's
    result lies on the CPU (a GPU's future completes as its work is queued: no completion)."""

    __slots__ = ("ring", "running")

    def __init__(self, ring: Ring, running: tuple[int, int]) -> None:
        self.ring, self.running = ring, running

    def __call__(self, future: Any) -> None:
        try:
            value = future.value()
            first = value[0] if isinstance(value, list) and value else value
            if getattr(first, "is_cpu", False):
                self.ring.finished(self.running)
        except Exception:  # (a Work that failed, or a result of no tensor: no completion)
            pass


def _gpu_said(what: str, exc: BaseException) -> None:
    from autoannot.keep.gpu_clock import said

    said(what, exc)


def open_from_environment(state: Any) -> Ring | None:
    """The ring ``AUTOANNOT_RING`` asks for, opened in ``state``; where it is unset but the
    watch is asked for (``AUTOANNOT_WATCH``, ``AUTOANNOT_WATCH_STORE``), one in its run's folder
    (``base.run_folders``); None where neither is. A value that cannot be used is said on
    stderr, once; the job runs without it."""
    from autoannot.base import config, run_folders

    folder = config.ring_folder()
    per_run = folder is None
    if per_run:
        if not config.watch_requested() and not config.watch_store_set():
            return None
        folder = run_folders.root()
    try:
        ring = Ring(folder, config.ring_launches(), per_run=per_run)
    except ValueError as exc:
        sys.stderr.write(f"autoannot: AUTOANNOT_RING_LAUNCHES: {exc}: no ring is kept\n")
        return None
    if config.gpu_times():  # (whether torch sees a GPU: asked at the first launch)
        from autoannot.keep.gpu_clock import CudaIfAny

        ring.gpu_source = CudaIfAny(ring, state.rerouted)
    state.open_journal(ring)
    return ring

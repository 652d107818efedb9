"""A launch: one rank's part in one collective — the row every reader gives (traces, record
files, rows) and the one analysis (``matching``) matches across ranks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Launch:
    """One rank's part in one collective."""

    rank: int
    group: str  # the process group's name ("0", "1", ...)
    seq: int  # its position in the group's sequence on this rank
    collective: str  # "Collective name"
    size_bytes: int
    group_size: int
    start_us: float  # in the rank's own time base (its trace's, or monotonic for records)
    end_us: float | None  # None where only the entry is known (a record file alone)
    call_site: str | None = None
    group_desc: str = ""
    #: Timed by a GPU kernel: it ends within microseconds on every rank (what fits clocks).
    #: gloo's CPU ranges end apart (its algorithm runs on each rank's CPU): not used to fit.
    kernel: bool = False
    #: When it was entered on the wall clock (us since the epoch; record files that say).
    wall_us: float | None = None
    #: The profiler step it ran in (``ProfilerStep#N``); -1 where no step is known.
    step: int = -1
    #: The group's member ranks, where the input names them all.
    group_ranks: tuple[int, ...] | None = None
    #: Its "dtype" ("Float", "BFloat16", ...); "" where unknown.
    dtype: str = ""
    #: When it completed on the wall clock (us since the epoch), where its journal knew (a
    #: ring's async launch on the CPU): what tells apart two launches run out of order.
    finished_wall_us: float | None = None
    #: The thread that was told it completed (its Work's future's callback), where known: for
    #: gloo, the worker thread that ran it (a trace's range's ``tid``).
    finished_thread: int | None = None
    #: Its start and end are the GPU's (timing events around it on its stream: when this
    #: rank's GPU reached it and when its stream could go on past it), not its host's.
    gpu: bool = False

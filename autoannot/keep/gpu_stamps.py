"""Stamps of the GPU's own clock, written by the GPU itself into the host's memory: a one-thread
kernel reads ``%globaltimer`` (the GPU's nanosecond clock) where its stream reaches it and writes
it into a slot of pinned host memory, one slot a run: a graph that captured it writes each
replay's time into a slot of its own (``depth`` of them, a ring), where an event captured in a
graph is one for all its replays.

Why by hand: no library launches such a kernel. torch has no op that reads the GPU's clock
into host memory, and compiling one needs a CUDA compiler at run time; the kernel here is
a dozen lines of PTX, which the driver's own JIT compiles (``cuModuleLoadData``), launched
through the driver's public API (``cuLaunchKernel``, in a capture: captured as a kernel node)
on the stream torch hands out. Nothing of torch's private state is touched.

A point is one place in the work a stamp is launched at (one in a graph: each replay runs it
once); its runs count up on the GPU (a counter in device memory), and each run writes its
time to host memory and, after a system fence, its count (``fenced``), or its time and its
run's tag in one 16-byte store with no fence (``tagged``: nothing waits for the store to
cross the bus; the host reads the tag before and after the time): the host reads run ``k``'s
time while it is one of the last ``depth``.
"""

from __future__ import annotations

import ctypes
from typing import Any

#: The kernels, by kind. ``tagged``: ``stamp(slots, counts, counter, mask)``
#: writes ``%globaltimer`` and its run's tag (the new count) into ``slots[counter & mask]`` (two
#: 64-bit words of host memory, one 16-byte store) and counts the run on the device: the host
#: takes a slot whose tag it reads the same before and after its time, and that tag says which
#: run wrote it; nothing waits for the store to reach the host (the default since it passed
#: the device checks on an H100, 2026-12-07: a decode replay of batch 32 1.0077x, the fenced
#: kernel 1.0098x, an empty one 1.0076x, alternated in one run). ``fenced``: the time alone into
#: the slot, then, after a system-wide fence (``membar.sys``: the kernel waits for its store to
#: reach the host), the new count into ``counts`` (the host reads a slot below the count).
#: ``empty``: nothing stored (what a branch and a launch cost alone: measured, never read).
PTX_HEAD = """
.version {version}
.target {target}
.address_size 64

.visible .entry autoannot_stamp(
    .param .u64 slots,
    .param .u64 counts,
    .param .u64 counter,
    .param .u32 mask
)
{{
    .reg .b32 %r<4>;
    .reg .b64 %rd<9>;
"""
#: Every kind's first part: the clock read, the run's slot found (``%rd6``: 16 bytes a slot),
#: the run counted (``%rd7``: the new count; ``%rd8``: the device counter).
PTX_SLOT = """
    mov.u64 %rd1, %globaltimer;
    ld.param.u64 %rd2, [slots];
    ld.param.u64 %rd8, [counter];
    ld.param.u32 %r1, [mask];
    ld.volatile.u64 %rd4, [%rd8];
    cvt.u32.u64 %r2, %rd4;
    and.b32 %r3, %r2, %r1;
    mul.wide.u32 %rd5, %r3, 16;
    add.s64 %rd6, %rd2, %rd5;
    add.s64 %rd7, %rd4, 1;
"""
#: Each kind's stores (after ``PTX_SLOT``).
PTX_STORES = {
    "tagged": """
    st.volatile.v2.u64 [%rd6], {{%rd1, %rd7}};
    st.volatile.u64 [%rd8], %rd7;
    ret;
}}
""",
    "fenced": """
    ld.param.u64 %rd3, [counts];
    st.volatile.u64 [%rd6], %rd1;
    st.volatile.u64 [%rd8], %rd7;
    membar.sys;
    st.volatile.u64 [%rd3], %rd7;
    ret;
}}
""",
    "empty": """
    ret;
}}
""",
}


def ptx(kind: str, version: str, target: str) -> str:
    """The kernel of ``kind`` (``PTX_STORES``) for a PTX ISA ``version`` and ``target``."""
    return (PTX_HEAD + PTX_SLOT + PTX_STORES[kind]).format(version=version, target=target)


#: Which kernel ``Stamps`` loads (``PTX_STORES``): ``tagged`` costs no more than an empty one.
KIND = "tagged"
#: (PTX ISA version, target) tried in order: the oldest this driver JITs for this GPU.
TARGETS = (("6.4", "sm_75"), ("6.0", "sm_70"), ("5.0", "sm_52"))


def tagged_time(slots: Any, at: int, run: int) -> int:
    """The time in the tagged slot at ``slots[at]`` (its tag at ``at + 1``) where run ``run``
    wrote it: 0 where no run past ``run - 1`` has written there yet, or the slot was being
    written as it was read (its tag changed: read again later), -1 where a later run wrote over
    it."""
    tag = slots[at + 1]
    if tag <= run:
        return 0
    if tag != run + 1:
        return -1
    value = slots[at]
    return value if slots[at + 1] == tag else 0


def fenced_time(slots: Any, at: int, counts: Any, point: int, run: int, depth: int) -> int:
    """The time in the fenced slot at ``slots[at]`` where run ``run`` of ``point`` wrote it
    (``counts[point]``: how many runs have written, each before it counted): 0 not yet, -1
    written over since (``depth`` runs later), asked again after the time is read."""
    count = counts[point]
    if run >= count:
        return 0
    if count - run > depth:
        return -1
    value = slots[at]
    return -1 if counts[point] - run > depth else value


class StampError(RuntimeError):
    """The driver refused a step of the stamps (its call and code said)."""


def _driver() -> Any:
    return ctypes.CDLL("libcuda.so.1")


_HELD: list[Any] = []


def held_driver() -> Any:
    """The driver's library whose calls hold Python's lock (each is microseconds: no thread
    switch around it), its event, stream-wait and launch functions typed; made once."""
    if not _HELD:
        held = ctypes.PyDLL("libcuda.so.1")
        handle = ctypes.c_void_p
        for name, args in (("cuCtxGetCurrent", [ctypes.POINTER(handle)]),
                           ("cuCtxSetCurrent", [handle]),
                           ("cuEventCreate", [ctypes.POINTER(handle), ctypes.c_uint]),
                           ("cuEventRecord", [handle, handle]),
                           ("cuEventQuery", [handle]),
                           ("cuEventDestroy_v2", [handle]),
                           ("cuEventElapsedTime", [ctypes.POINTER(ctypes.c_float), handle,
                                                   handle]),
                           ("cuStreamWaitEvent", [handle, handle, ctypes.c_uint]),
                           ("cuLaunchKernel", [handle, *[ctypes.c_uint] * 7, handle, handle,
                                               handle])):
            function = getattr(held, name)
            function.argtypes, function.restype = args, ctypes.c_int
        _HELD.append(held)
    return _HELD[0]


def _check(code: int, what: str) -> None:
    if code != 0:
        raise StampError(f"{what} failed: CUresult {code}")


class Stamps:
    """``points`` places a stamp can be launched at, each with ``depth`` slots (a power of
    two): the module loaded in the current CUDA context, the memory made (the caller's device
    must be current; torch made the context)."""

    def __init__(self, points: int = 4096, depth: int = 64, kind: str | None = None) -> None:
        import torch

        if depth & (depth - 1):
            raise ValueError(f"depth {depth} is not a power of two")
        self.points, self.depth = points, depth
        self.kind = KIND if kind is None else kind
        self._cuda = _driver()
        self._function = self._load()
        self._launch = self._cuda.cuLaunchKernel
        self._held = held_driver()  # (the eager path's calls)
        self._slots = torch.zeros(points * depth * 2, dtype=torch.int64, pin_memory=True)
        self._counts = torch.zeros(points, dtype=torch.int64, pin_memory=True)
        self._counters = torch.zeros(points, dtype=torch.int64, device="cuda")
        self.slots = (ctypes.c_int64 * (points * depth * 2)).from_address(self._slots.data_ptr())
        self.counts = (ctypes.c_int64 * points).from_address(self._counts.data_ptr())
        self._used = 0
        self._args: list[Any] = []

    def _load(self) -> Any:
        cuda = self._cuda
        context = ctypes.c_void_p()
        _check(cuda.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
        if not context.value:
            raise StampError("no current CUDA context")
        module = ctypes.c_void_p()
        code = -1
        for version, target in TARGETS:
            image = ptx(self.kind, version, target).encode() + b"\0"
            code = cuda.cuModuleLoadData(ctypes.byref(module), image)
            if code == 0:
                break
        _check(code, "cuModuleLoadData")
        function = ctypes.c_void_p()
        _check(cuda.cuModuleGetFunction(ctypes.byref(function), module, b"autoannot_stamp"),
               "cuModuleGetFunction")
        cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.c_void_p]
        cuda.cuLaunchKernel.restype = ctypes.c_int
        self._module = module
        return function

    def new_point(self) -> int:
        """A point of its own (its counter at 0); StampError where all are taken."""
        point = self._used
        if point >= self.points:
            raise StampError(f"all {self.points} points taken")
        self._used = point + 1
        slots = ctypes.c_uint64(self._slots.data_ptr() + point * self.depth * 16)
        counts = ctypes.c_uint64(self._counts.data_ptr() + point * 8)
        counter = ctypes.c_uint64(self._counters.data_ptr() + point * 8)
        mask = ctypes.c_uint32(self.depth - 1)
        values = (slots, counts, counter, mask)
        args = (ctypes.c_void_p * 4)(*(ctypes.addressof(v) for v in values))
        self._args.append((values, args))
        return point

    def launch(self, point: int, stream: int) -> None:
        """The stamp of ``point`` launched on ``stream`` (a ``cudaStream_t`` as an int)."""
        code = self._launch(self._function, 1, 1, 1, 1, 1, 1, 0, stream, self._args[point][1],
                            None)
        if code:
            _check(code, "cuLaunchKernel")

    def new_fork(self) -> int:
        """An event without timing (a driver's handle): what a branch waits on."""
        event = ctypes.c_void_p()
        _check(self._held.cuEventCreate(ctypes.byref(event), 2), "cuEventCreate")
        return event.value

    def launch_after(self, point: int, stream: int, branch: int, fork: int) -> None:
        """The stamp of ``point`` launched on ``branch`` once ``branch`` has waited for the
        work on ``stream`` so far (``fork``: an event of ``new_fork``, recorded on ``stream``
        here): three calls of the driver, ``stream`` held by none."""
        held = self._held
        code = held.cuEventRecord(fork, stream) or held.cuStreamWaitEvent(branch, fork, 0) \
            or held.cuLaunchKernel(self._function, 1, 1, 1, 1, 1, 1, 0, branch,
                                   self._args[point][1], None)
        if code:
            _check(code, "a stamp's launch on a branch")

    def stamp(self, stream: int) -> int:
        """A new point, its stamp launched on ``stream``: the point."""
        point = self.new_point()
        self.launch(point, stream)
        return point

    def time(self, point: int, run: int) -> int:
        """The GPU's clock (ns) at ``point``'s run ``run`` (0 first); 0 where that run has not
        written yet, -1 where its slot was written over since (the reader fell ``depth`` runs
        behind)."""
        at = (point * self.depth + (run & (self.depth - 1))) * 2
        slots = self.slots
        if self.kind == "fenced":
            return fenced_time(slots, at, self.counts, point, run, self.depth)
        return tagged_time(slots, at, run)

    def reset(self) -> None:
        """Every point free again, its counts 0 (after the GPU is done with them)."""
        self._counters.zero_()
        ctypes.memset(self._counts.data_ptr(), 0, self.points * 8)
        self._used = 0
        self._args.clear()

"""Stamps of the GPU's own clock, written by the GPU itself into the host's memory: a one-thread
kernel reads ``%globaltimer`` (the GPU's nanosecond clock) where its stream reaches it and writes
it into a slot of pinned host memory, one slot a run: a graph that captured it writes each
replay's time into a slot of its own (``depth`` of them, a ring), where an event captured in a
graph is one for all its replays.

Why by hand: no library launches such a kernel. torch has no op that reads the GPU's clock
into host memory, and compiling one needs a CUDA compiler at run time; the kernel here is
eleven lines of PTX, which the driver's own JIT compiles (``cuModuleLoadData``), launched
through the driver's public API (``cuLaunchKernel``, in a capture: captured as a kernel node)
on the stream torch hands out. Nothing of torch's private state is touched.

A point is one place in the work a stamp is launched at (one in a graph: each replay runs it
once); its runs count up on the GPU (a counter in device memory), and each run writes its
time and its run number to host memory: the host reads run ``k``'s time while it is one of
the last ``depth``.
"""

from __future__ import annotations

import ctypes
from typing import Any

#: The kernel: ``stamp(slots, counts, counter, mask)`` writes ``%globaltimer`` into
#: ``slots[counter & mask]`` and the new count into ``*counts`` (host memory), after it.
PTX = """
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
    mov.u64 %rd1, %globaltimer;
    ld.param.u64 %rd2, [slots];
    ld.param.u64 %rd3, [counts];
    ld.param.u64 %rd8, [counter];
    ld.param.u32 %r1, [mask];
    ld.volatile.u64 %rd4, [%rd8];
    cvt.u32.u64 %r2, %rd4;
    and.b32 %r3, %r2, %r1;
    mul.wide.u32 %rd5, %r3, 8;
    add.s64 %rd6, %rd2, %rd5;
    st.volatile.u64 [%rd6], %rd1;
    add.s64 %rd7, %rd4, 1;
    st.volatile.u64 [%rd8], %rd7;
    membar.sys;
    st.volatile.u64 [%rd3], %rd7;
    ret;
}}
"""
#: (PTX ISA version, target) tried in order: the oldest this driver JITs for this GPU.
TARGETS = (("6.4", "sm_75"), ("6.0", "sm_70"), ("5.0", "sm_52"))


class StampError(RuntimeError):
    """The driver refused a step of the stamps (its call and code said)."""


def _driver() -> Any:
    return ctypes.CDLL("libcuda.so.1")


def _check(code: int, what: str) -> None:
    if code != 0:
        raise StampError(f"{what} failed: CUresult {code}")


class Stamps:
    """``points`` places a stamp can be launched at, each with ``depth`` slots (a power of
    two): the module loaded in the current CUDA context, the memory made (the caller's device
    must be current; torch made the context)."""

    def __init__(self, points: int = 4096, depth: int = 64) -> None:
        import torch

        if depth & (depth - 1):
            raise ValueError(f"depth {depth} is not a power of two")
        self.points, self.depth = points, depth
        self._cuda = _driver()
        self._function = self._load()
        self._launch = self._cuda.cuLaunchKernel
        self._slots = torch.zeros(points * depth, dtype=torch.int64, pin_memory=True)
        self._counts = torch.zeros(points, dtype=torch.int64, pin_memory=True)
        self._counters = torch.zeros(points, dtype=torch.int64, device="cuda")
        self.slots = (ctypes.c_int64 * (points * depth)).from_address(self._slots.data_ptr())
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
            image = PTX.format(version=version, target=target).encode() + b"\0"
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
        slots = ctypes.c_uint64(self._slots.data_ptr() + point * self.depth * 8)
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

    def stamp(self, stream: int) -> int:
        """A new point, its stamp launched on ``stream``: the point."""
        point = self.new_point()
        self.launch(point, stream)
        return point

    def count(self, point: int) -> int:
        """How many runs of ``point`` have written their time."""
        return self.counts[point]

    def time(self, point: int, run: int) -> int:
        """The GPU's clock (ns) at ``point``'s run ``run`` (0 first); 0 where that run has not
        written yet or its slot was written over since."""
        count = self.counts[point]
        if run >= count or count - run > self.depth:
            return 0
        at = self.slots[point * self.depth + (run & (self.depth - 1))]
        if self.counts[point] - run > self.depth:  # (written over as it was read)
            return 0
        return at

    def reset(self) -> None:
        """Every point free again, its counts 0 (after the GPU is done with them)."""
        self._counters.zero_()
        ctypes.memset(self._counts.data_ptr(), 0, self.points * 8)
        self._used = 0
        self._args.clear()

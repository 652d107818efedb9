"""Differential fuzzing of the wrapped APIs: generated calls (valid and not) run with the agent
off, on with nothing to do, and on annotating; return values (tensors bitwise), in-place
results and exceptions (type and message) must not differ."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import autoannot

#: c10d functions, and the _c10d_functional ops compiled code calls ("ops." + op name).
APIS = ["all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
        "reduce_scatter_tensor", "reduce_scatter", "all_to_all_single", "all_to_all", "gather",
        "scatter", "barrier", "all_reduce_coalesced", "send", "isend"]
# Not recv/irecv: on a one-rank group a receive from itself waits forever.
APIS += [f"ops.{name}" for name in (
    "all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_",
    "all_gather_into_tensor", "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor", "reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced",
    "all_to_all_single", "broadcast", "broadcast_")
    if hasattr(torch.ops._c10d_functional, name)]
#: ProcessGroup methods called directly, as C++ callers (DDP's reducer) call the group: no proxy
#: sees them, only the c10d:: kernels. pybind overloads: their parameters are listed here. Not
#: send/recv: on a one-rank group a point-to-point call to itself waits forever.
PG_METHODS = {
    "allreduce": ("tensors", "op"), "broadcast": ("tensor", "root"),
    "reduce": ("tensor", "root", "op"), "allgather": ("output_lists", "input_tensors"),
    "_allgather_base": ("output", "input"),
    "reduce_scatter": ("output_tensors", "input_lists"),
    "_reduce_scatter_base": ("output", "input"),
    "alltoall_base": ("output", "input", "output_split_sizes", "input_split_sizes"),
    "alltoall": ("output_tensors", "input_tensors"), "allreduce_coalesced": ("tensors",),
    "allgather_into_tensor_coalesced": ("outputs", "inputs"),
    "reduce_scatter_tensor_coalesced": ("outputs", "inputs"), "barrier": (),
    "gather": ("output_lists", "input_tensors"), "scatter": ("output_tensors", "input_lists"),
}
APIS += [f"pg.{name}" for name in PG_METHODS if hasattr(dist.ProcessGroup, name)]
DTYPES = [torch.float32, torch.int64, torch.bfloat16, torch.float16, torch.complex64,
          torch.bool, torch.uint8]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT,
       dist.ReduceOp.AVG]

tensor_spec = st.tuples(st.just("tensor"), st.sampled_from(DTYPES), st.integers(0, 5),
                        st.booleans())  # (kind, dtype, numel, 2-D)
value_spec = st.one_of(
    tensor_spec,
    st.lists(tensor_spec, max_size=3).map(lambda items: ("list", items)),
    st.integers(-2, 3).map(lambda n: ("int", n)),
    st.sampled_from([("none",), ("str",), ("float",), ("world",), ("garbage",), ("true",),
                     ("false",)]),
    st.sampled_from(range(len(OPS))).map(lambda i: ("op", i)),
    st.lists(st.integers(0, 4), max_size=3).map(lambda xs: ("ints", xs)),
)


class PythonGroup(dist.ProcessGroup):
    """A process group implemented in Python: completes every all_reduce/broadcast/barrier at
    once (torch's tests have such groups); ``hostile``: its ``rank()`` raises — torch never
    asks, the agent does (the metadata fails while the collective succeeds)."""

    def __init__(self, hostile: bool = False) -> None:
        super().__init__(0, 1)
        self.hostile = hostile

    def rank(self) -> int:
        if self.hostile:
            raise RuntimeError("no rank here")
        return super().rank()

    def _done(self, value: Any) -> Any:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(value)
        return torch._C._distributed_c10d._create_work_from_future(future)

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        return self._done(tensors)

    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        return self._done(tensors)

    def barrier(self, opts: Any = None) -> Any:
        return self._done(None)


_GROUPS: dict[str, Any] = {}


def _group(kind: str) -> Any:
    """Groups torch did not register (built once per process)."""
    if kind not in _GROUPS:
        _GROUPS[kind] = {"pygroup": lambda: PythonGroup(), "hostile": lambda: PythonGroup(True),
                         "unregistered": lambda: dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
                         }[kind]()
    return _GROUPS[kind]


def build(spec: Any) -> Any:
    kind = spec[0]
    if kind in ("pygroup", "hostile", "unregistered"):
        return _group(kind)
    if kind == "tensor":
        _, dtype, numel, two_d = spec
        t = (torch.arange(numel) % 3).to(dtype)
        return t.view(1, numel) if two_d else t
    if kind == "list":
        return [build(s) for s in spec[1]]
    if kind == "int":
        return spec[1]
    if kind == "op":
        return OPS[spec[1]]
    if kind == "ints":
        return list(spec[1])
    if kind == "reduce_op":
        return spec[1]
    return {"none": None, "str": "x", "float": 0.5, "world": dist.group.WORLD,
            "garbage": object(), "true": True, "false": False,
            "group_name": dist.group.WORLD.group_name}[kind]


same_size = st.tuples(st.sampled_from(DTYPES[:4]), st.integers(1, 4)).map(
    lambda dn: ("tensor", dn[0], dn[1], False))
tensor_list = st.lists(same_size, min_size=1, max_size=2).map(lambda items: ("list", items))


def _likely(name: str) -> st.SearchStrategy:
    """Mostly well-typed values for a parameter, sometimes anything: valid calls get through,
    invalid ones test the error paths."""
    if name.endswith("_lists"):
        good = st.lists(tensor_list, min_size=1, max_size=1).map(lambda items: ("list", items))
    elif name.endswith(("_list", "tensors")) or name in ("inputs", "outputs"):
        good = tensor_list
    elif name in ("tensor", "input", "output", "output_tensor", "input_tensor", "out"):
        good = same_size
    elif name == "reduce_op":
        good = st.sampled_from(["sum", "max", "avg", "nope"]).map(lambda op: ("reduce_op", op))
    elif name == "group_name":
        good = st.sampled_from([("group_name",), ("world",), ("str",)])
    elif name == "group_size":
        good = st.sampled_from([("int", 1), ("int", 2)])
    elif name in ("src", "dst", "group_src", "group_dst"):
        good = st.sampled_from([("int", 0), ("none",)])
    elif name == "root":
        good = st.sampled_from([("int", 0), ("int", 1)])
    elif name == "op":
        good = st.sampled_from(range(3)).map(lambda i: ("op", i))
    elif name == "group":
        good = st.sampled_from([("none",), ("world",), ("none",), ("world",), ("pygroup",),
                                ("hostile",), ("unregistered",)])
    elif name.endswith("split_sizes"):
        good = st.sampled_from([("none",), ("ints", [1]), ("ints", [2])])
    else:
        good = st.sampled_from([("none",), ("false",)])
    return good


def _anything(name: str) -> st.SearchStrategy:
    return st.one_of(_likely(name), _likely(name), _likely(name), value_spec)


def _parameters(api: str) -> list[tuple[str, bool, bool]]:
    """(name, required, keyword-only) of each parameter of a c10d function, an op or a
    ProcessGroup method (all of whose listed parameters are passed)."""
    if api.startswith("pg."):
        return [(name, True, False) for name in PG_METHODS[api[3:]]]
    if api.startswith("ops."):
        schema = getattr(torch.ops._c10d_functional, api[4:]).default._schema
        return [(a.name, not a.has_default_value(), a.kwarg_only) for a in schema.arguments]
    params = inspect.signature(getattr(dist, api)).parameters.values()
    return [(p.name, p.default is inspect.Parameter.empty, False) for p in params]


def target(api: str) -> Any:
    if api.startswith("pg."):
        return getattr(dist.group.WORLD, api[3:])
    if api.startswith("ops."):
        return getattr(torch.ops._c10d_functional, api[4:]).default
    return getattr(dist, api)


_RANKS = ("src", "dst", "group_src", "group_dst")
_INT_LIKE = ("op", "int", "true", "false", "float")


_MALFORMED_COALESCED = """
import os, sys, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
dist.group.WORLD.allgather_into_tensor_coalesced([torch.ones(2)], [torch.ones(2)] * 2).wait()
"""


def aborting_apis() -> frozenset[str]:
    """What this torch's gloo kills the process on, given malformed sizes (a failed CHECK in
    C++, not an exception; gloo before torch 2.10): its reduce-scatters and coalesced
    all-gathers. Probed with the agent off, in a child process. Not what we fuzz there."""
    from harness import free_port

    child = subprocess.run([sys.executable, "-c", _MALFORMED_COALESCED, str(free_port())],
                           capture_output=True, timeout=120)
    if child.returncode >= 0:  # raised (or returned): an exception, as the fuzz expects
        return frozenset()
    return frozenset(api for api in APIS
                     if "reduce_scatter" in api or "gather_into_tensor_coalesced" in api)


ABORTING_APIS: frozenset[str] = frozenset()


def call_spec():
    @st.composite
    def draw(draw_fn):
        api = draw_fn(st.sampled_from([a for a in APIS if a not in ABORTING_APIS]))
        parameters = _parameters(api)
        params = [name for name, _, _ in parameters]
        chosen = [name for name, required, _ in parameters
                  if required or draw_fn(st.integers(0, 3)) == 0]
        # Half the calls are well-typed throughout (most of them succeed); the others may
        # put anything anywhere (most of them raise).
        strategy = _likely if draw_fn(st.booleans()) else _anything
        values = [draw_fn(strategy(p)) for p in chosen]
        # torch 2.13 itself crashes (SIGSEGV) on a ReduceOp given as a peer rank to send, and
        # a send to a rank outside a one-rank gloo group waits forever: not what we fuzz.
        # Anything that converts to an int (True, 0.5, a ReduceOp) is such a rank.
        if api in ("send", "isend"):
            values = [("int", 0) if p in _RANKS and v[0] in _INT_LIKE else v
                      for p, v in zip(chosen, values, strict=True)]
        # The ops divide by group_size in C++: 0 (or False, or ReduceOp.SUM) is a SIGFPE.
        values = [("int", v[1] or 1) if p == "group_size" and v[0] == "int" else
                  ("int", 2) if p == "group_size" and v[0] in _INT_LIKE else v
                  for p, v in zip(chosen, values, strict=True)]
        positional = draw_fn(st.integers(0, len(chosen)))
        keyword_only = {name for name, _, kw_only in parameters if kw_only}
        if chosen[:positional] != params[:positional] or keyword_only & set(
                chosen[:positional]):  # positional only as a prefix, never keyword-only
            positional = 0
        if api.startswith("pg."):  # pybind methods: the names above are ours, pass by position
            positional = len(chosen)
        return api, chosen, values, positional
    return draw()


def _bytes(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().flatten().view(torch.uint8).tolist())


def _summary(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), _bytes(value))
    if isinstance(value, list | tuple):
        return [_summary(v) for v in value]
    if value is None or isinstance(value, int | float | str | bool):
        return value
    return type(value).__name__


def _without_contents(value: Any) -> Any:
    """A summary with the tensors' bytes left out."""
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "tensor":
        return value[:3]
    if isinstance(value, list | tuple):
        return type(value)(_without_contents(v) for v in value)
    return value


def _dirtied_heaps(times: int = 4) -> Any:
    """Yields ``times``, each time after filling and freeing heap memory with a new byte: a
    result that reads uninitialized memory (torch's, e.g. gloo's all-to-all into another
    dtype) changes then, even where the allocator would hand the same bytes back."""
    for fill in range(1, times + 1):
        for size in (8, 64, 512, 4096, 65536):
            torch.full((size,), fill * 37, dtype=torch.uint8)
        yield fill


#: A file that gets each generated call before it runs (``AUTOANNOT_FUZZ_TRACE``).
TRACE = os.environ.get("AUTOANNOT_FUZZ_TRACE")

#: "ignore", or "error": warnings raised as errors (torch's own, with the agent off too).
WARNINGS = ["ignore"]


def _chain(exc: BaseException) -> list[tuple[str, str, str]]:
    """The exceptions ``exc`` carries (``__cause__``, else ``__context__``, and on)."""
    chain = []
    while True:
        link = "cause" if exc.__cause__ is not None else "context"
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        if exc is None:
            return chain
        chain.append((link, type(exc).__name__, re.sub(r"0x[0-9a-f]+", "0x?", str(exc))[:200]))


def _agent_frames(exc: BaseException) -> list[str]:
    """Frames of autoannot a traceback shows (pytest and IPython hide ``__tracebackhide__``)."""
    shown, tb = [], exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if "/autoannot/" in frame.f_code.co_filename and not frame.f_locals.get(
                "__tracebackhide__"):
            shown.append(frame.f_code.co_name)
        tb = tb.tb_next
    return shown


def run_once(api: str, chosen: list[str], values: list[Any], positional: int) -> Any:
    args = [build(v) for v in values]
    pos, kw = args[:positional], dict(zip(chosen[positional:], args[positional:], strict=True))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter(WARNINGS[0])
            result = target(api)(*pos, **kw)
            if hasattr(result, "wait"):
                result.wait()
            elif api.startswith("ops."):  # an op's outputs are waited on, as compiled code does
                for tensor in result if isinstance(result, list) else [result]:
                    torch.ops._c10d_functional.wait_tensor(tensor)
        outcome: tuple = ("returned", _summary(result))
    except Exception as exc:
        message = re.sub(r"0x[0-9a-f]+", "0x?", str(exc))  # object addresses
        message = re.sub(r"\[[A-Z]\d{4} [\d:.]+ ", "[", message)  # c10 log timestamps
        # A call with no tensor at all fails in torch's dispatcher, whose message lists the
        # op's kernels and fallbacks: with the agent on, that list names its kernels and its
        # DeferredInit fall-through (the one documented difference; the error and the rest of
        # the text are torch's).
        message = re.sub(r"\n(BackendSelect|DeferredInit): [^\n]*", r"\n\1: <ours>", message)
        message = re.sub(r"\nDeferredInit: <ours>", "", message).replace("DeferredInit, ", "")
        outcome = ("raised", type(exc).__name__, message, _chain(exc), _agent_frames(exc))
    return outcome, _summary(args)


_F32 = ("tensor", torch.float32, 3, False)


def fuzz(rank: int, world: int, examples: int, fixed: bool, warnings_as: str = "ignore"
         ) -> dict[str, Any]:
    """``warnings_as="error"``: every call runs with warnings raised as errors."""
    global ABORTING_APIS
    WARNINGS[0] = warnings_as
    ABORTING_APIS = aborting_apis()
    stats = {"calls": 0, "raised": 0, "nondeterministic": 0, "differences": [],
             "constrained": sorted(ABORTING_APIS)}
    started = time.monotonic()

    @settings(max_examples=examples, deadline=None, database=None, derandomize=fixed,
              suppress_health_check=list(HealthCheck))
    @given(call_spec())
    @example(("all_reduce", ["tensor", "group"], [_F32, ("hostile",)], 0))
    @example(("all_reduce", ["tensor", "group"], [_F32, ("pygroup",)], 1))
    @example(("barrier", ["group"], [("hostile",)], 0))
    @example(("all_reduce", ["tensor", "group"], [_F32, ("unregistered",)], 2))
    def check(spec: tuple) -> None:
        if TRACE:  # which call a crash of torch itself (a signal, no traceback) came from
            with open(TRACE, "a") as log:
                print(repr(spec), file=log)
        autoannot.disable()
        off = run_once(*spec)
        autoannot.enable()
        fast = run_once(*spec)
        with autoannot.record(dispatcher=True):
            annotating = run_once(*spec)
        autoannot.disable()
        stats["calls"] += 1
        if not fixed and stats["calls"] % 500 == 0:  # long runs show progress
            print(f"fuzz: {stats['calls']}/{examples} calls, {time.monotonic() - started:.0f} s",
                  file=sys.stderr, flush=True)
        stats["raised"] += off[0][0] == "raised"
        if not off == fast == annotating:
            # torch itself returns uninitialized memory for some invalid calls (e.g. a
            # coalesced all-gather of mixed dtypes on gloo): when a mode's result does not
            # come back the same when run again (the agent off, after dirtying the heap; or
            # the differing mode itself: once the off runs agreed by chance and the fast path
            # read a stale pointer), the contents say nothing; types, shapes and errors still
            # must match. A difference the agent makes comes back each time.
            autoannot.disable()
            unstable = any(run_once(*spec) != off for _ in _dirtied_heaps())
            autoannot.enable()
            unstable = unstable or (fast != off and run_once(*spec) != fast)
            if annotating != off and not unstable:
                with autoannot.record(dispatcher=True):
                    unstable = run_once(*spec) != annotating
            autoannot.disable()
            if unstable:
                stats["nondeterministic"] += 1
                off, fast, annotating = (_without_contents(x) for x in (off, fast, annotating))
        if not off == fast == annotating:
            stats["differences"].append(repr((spec, off, fast, annotating))[:2000])

    check()
    return stats

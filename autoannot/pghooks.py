"""Torch's process-group hooks as the observer of the launches no proxy sees, where torch has
them (``ProcessGroup.register_pre_hook`` / ``register_post_hook``, torch >= 2.14).

Torch fires a group's hooks from its ``c10d::`` dispatcher kernels, around every collective
issued through the group: the Python API's, ``pg.allreduce(...)``, DDP's reducer and
``_broadcast_coalesced`` (C++), compiled code, batched p2p, coalesced blocks; NCCL and gloo.
Nothing else is needed to see them: no dispatch key (the Python layer's ``DeferredInit``), no
RecordFunction callback that every operator pays for (the native observer's, with a record
file), no compiler.

Torch's contract for them: "registration is expected to happen at setup time, not
concurrently with collectives" (its hooks live in a map the collective's thread iterates; a
hook added or removed while another thread issues a collective on the group can crash the
process — seen: a segfault in a test toggling the agent from a thread). So each group gets the
agent's hooks once, when it is made (the one funnel torch makes groups through,
``_new_process_group_helper``, is wrapped: torch gives no public notice of a new group), or at
``enable()`` for the groups that exist then; they are never removed. While nothing asks — no
``record()`` that wants such launches, no record file — they return at once (a Python call
per collective; measured in docs/benchmarks.md). While something asks, the pre-hook writes the
launch to the record file before it runs and the post-hook gives it to the recorders once
issued. A launch a proxy annotates (the Python API) is the proxy's: the hooks leave every
launch made inside a wrapped call alone, so no launch is recorded twice.

A launch another observer records stays theirs: the native observer's (every thread), the
Python layer's on a thread that includes its key. The hooks record the rest: launches on
threads the Python layer does not reach, and every launch below the Python API where the layer
cannot run (another library owns its key: torchdistx). Why not all of them: what a hook is
told is the op's kind (``HookOpName``), its tensors, its root or peer — not the op, so a
coalesced op of one tensor reads as its single-tensor form, and a compiled funcol op as the
``c10d::`` op under it; the layers know the op. Each launch is derived from what the hook
tells by the table's rule for the ``c10d::`` op it came through, as the other observers
derive theirs. What it is not told, it does not invent: an ``all_to_all_single``'s
split sizes (torch's hooks do not carry them; an uneven one is annotated as even, said in
docs/internals.md). CUDA-graph captures are still noted by the native observer or the Python
layer.
"""

from __future__ import annotations

import atexit
import functools
import sys
import threading
import weakref
from _thread import get_ident
from typing import Any

from autoannot import diagnostics, metadata, sites
from autoannot.records import enter, new_record

#: The id autoannot's hooks are registered under on every group ("auta").
HOOK_ID = 0x61757461
#: Launches given to the journals whose post-hook has not come (a collective that raised):
#: at most this many are kept.
PENDING_LIMIT = 1024


def available() -> bool:
    """Whether this torch's process groups take pre/post collective hooks."""
    c10d = sys.modules.get("torch._C._distributed_c10d")
    group = getattr(c10d, "ProcessGroup", None)
    return all(hasattr(group, name) for name in ("register_pre_hook", "register_post_hook",
                                                 "unregister_pre_hook", "unregister_post_hook"))


def _op_call(name: str, inputs: list[Any], outputs: list[Any], root: int, size: int
             ) -> tuple[str, dict[str, Any]] | None:
    """The ``c10d::`` op a hook's launch came through, and its arguments by name (as far as
    the hook tells them); None for one that launches no collective (a split, a window)."""
    one_in, one_out = len(inputs) == 1, len(outputs) == 1
    if name == "ALLREDUCE":
        return ("c10d::allreduce_" if one_in else "c10d::allreduce_coalesced_",
                {"tensors": inputs})
    if name == "BROADCAST":
        return "c10d::broadcast_", {"tensors": inputs, "root_rank": root, "root_tensor": 0}
    if name == "REDUCE":
        return "c10d::reduce_", {"tensors": inputs, "root_rank": root, "root_tensor": 0}
    if name == "ALLGATHER":
        if one_in and one_out:
            return "c10d::_allgather_base_", {"output_tensor": outputs[0],
                                              "input_tensor": inputs[0]}
        if one_in:
            return "c10d::allgather_", {"output_tensors": [outputs], "input_tensors": inputs}
        if len(outputs) == len(inputs):
            return "c10d::allgather_into_tensor_coalesced_", {"outputs": outputs,
                                                             "inputs": inputs}
        return "c10d::allgather_coalesced_", {
            "output_lists": [outputs[i:i + size] for i in range(0, len(outputs), size)],
            "input_list": inputs}
    if name == "REDUCE_SCATTER":
        if one_in and one_out:
            return "c10d::_reduce_scatter_base_", {"output_tensor": outputs[0],
                                                   "input_tensor": inputs[0]}
        if one_out:
            return "c10d::reduce_scatter_", {"output_tensors": outputs,
                                             "input_tensors": [inputs]}
        return "c10d::reduce_scatter_tensor_coalesced_", {"outputs": outputs, "inputs": inputs}
    if name == "ALLTOALL":
        if one_in and one_out:  # (the hooks carry no split sizes: taken as even)
            return "c10d::alltoall_base_", {"output": outputs[0], "input": inputs[0],
                                            "output_split_sizes": [], "input_split_sizes": []}
        return "c10d::alltoall_", {"output_tensors": outputs, "input_tensors": inputs}
    if name == "BARRIER":
        return "c10d::barrier", {}
    if name == "SEND":
        return "c10d::send", {"tensors": inputs, "dst": root, "tag": 0}
    if name == "RECV":
        return "c10d::recv_", {"tensors": inputs, "src": root, "tag": 0}
    if name == "GATHER":
        return "c10d::gather_", {
            "output_tensors": [outputs] if outputs else [], "input_tensors": inputs,
            "root_rank": root}
    if name == "SCATTER":
        return "c10d::scatter_", {"output_tensors": outputs,
                                  "input_tensors": [inputs] if inputs else [], "root_rank": root}
    return None


_NAMES: dict[Any, str] = {}  # HookOpName -> its name ("ALLREDUCE")


class HookObserver:
    """The agent's hooks on every group, recording while something asks for launches no
    proxy sees. ``agent``: the ``Instrumentation`` (its ``state``)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self._ops: dict[str, Any] | None = None  # (at the first launch: torch may be importing)
        self._groups: dict[int, weakref.ref] = {}  # id -> the groups hooked now
        self._pending: dict[tuple[int, int], Any] = {}  # (group, op id) -> its record
        self._lock = threading.Lock()
        self._key: Any = None  # (the check of the Python layer's key, its key)
        self.on = False
        atexit.register(self.unhook_all)

    def __repr__(self) -> str:
        return f"HookObserver(on={self.on}, groups={len(self._groups)})"

    # what the agent's state asks for ------------------------------------------------------

    def demand_changed(self, state: Any) -> None:
        """(``State`` listener, under its lock) Whether the hooks record: while a recorder that
        wants launches no proxy sees, or a journal, is open."""
        on = state.live and (bool(state.journals) or any(not r.python_api_only
                                                          for r in state.recorders))
        if not on:
            self._pending.clear()
        self.on = on

    def hook_groups(self, groups: list[Any]) -> None:
        """Give ``groups`` the agent's hooks, those that have none yet (a group just made, or
        the groups there are at ``enable()``: the setup time torch's contract asks for)."""
        with self._lock:
            for group in groups:
                self._hook(group)

    def _hook(self, group: Any) -> None:
        if id(group) in self._groups or not hasattr(group, "register_pre_hook"):
            return
        ref = weakref.ref(group)
        key = id(group)
        try:
            group.register_pre_hook(HOOK_ID, functools.partial(self._before, ref))
            group.register_post_hook(HOOK_ID, functools.partial(self._after, key))
        except Exception as exc:  # this group's launches go unrecorded here
            diagnostics.warn_once("process group hooks", "registering", exc)
            return
        self._groups[key] = ref
        weakref.finalize(group, self._groups.pop, key, None)  # (its id may be reused)

    def unhook_all(self) -> None:
        """At the interpreter's exit: off every group. A group that outlives the interpreter
        (no ``destroy_process_group``) would otherwise free the hooks, Python callables,
        after Python is gone: the process crashed at exit (SIGSEGV). No collective is issued
        then."""
        with self._lock:
            for ref in list(self._groups.values()):
                group = ref()
                if group is None:
                    continue
                try:
                    group.unregister_pre_hook(HOOK_ID)
                    group.unregister_post_hook(HOOK_ID)
                except Exception:  # a group torch has shut down: nothing to remove
                    pass
            self._groups.clear()

    # the hooks ----------------------------------------------------------------------------

    def _before(self, ref: weakref.ref, args: Any) -> None:
        """(torch's pre-hook) A launch about to be issued: to the journals now."""
        if not self.on:  # (nothing asks: at once)
            return
        state = self.agent.state
        if state.inside.get(get_ident()) or self._seen_by_a_layer():
            return
        try:
            record = self._record(ref(), args)
        except Exception as exc:  # this launch goes unrecorded; the collective runs
            diagnostics.warn_once(f"c10d.{getattr(args.name, 'name', args.name)}",
                                  "deriving the collective metadata", exc)
            return
        if record is None:
            return
        enter(state, record)
        if any(not r.python_api_only for r in state.recorders):
            if len(self._pending) >= PENDING_LIMIT:  # (launches that raised: let go)
                self._pending.clear()
            self._pending[(id(ref()), args.op_id)] = record

    def _seen_by_a_layer(self) -> bool:
        """Whether another observer records this launch: the native observer (every thread),
        or the Python layer on a thread that includes its key (where it holds the key). Those
        know the op itself (a funcol op's label; a coalesced op of one tensor, which a hook
        cannot tell from its single-tensor form): where they see a launch, theirs stands."""
        agent = self.agent
        if agent.observer is not None:
            return True
        layer = agent.layer
        if layer is None or layer.stepped_aside or not layer.holders:
            return False
        if self._key is None:
            import torch

            from autoannot import dispatch

            self._key = (torch._C._dispatch_tls_is_dispatch_key_included,
                         torch._C._dispatch_key_parse(dispatch.KEY))
        included, key = self._key
        return bool(included(key))

    def _after(self, key: int, args: Any) -> None:
        """(torch's post-hook) The launch was issued: to the recorders."""
        record = self._pending.pop((key, args.op_id), None)
        if record is None:
            return
        for recording in self.agent.state.recorders:
            if not recording.python_api_only:
                recording.append(record)

    def _record(self, group: Any, args: Any) -> Any:
        """The record of one hooked launch; None where it is no collective."""
        if group is None:
            return None
        name = _NAMES.get(args.name)
        if name is None:
            name = _NAMES[args.name] = getattr(args.name, "name", str(args.name).split(".")[-1])
        call = _op_call(name, list(args.input_tensors), list(args.output_tensors),
                        int(args.root), group.size())
        if call is None:
            return None
        op, arguments = call
        if self._ops is None:
            from autoannot import observer

            self._ops = observer._ops()
        known = self._ops.get(op)
        if known is None or known.plan is None:
            return None
        arguments["process_group"] = group.boxed()  # (as the dispatcher passes it)
        launch = known.plan.derive((), arguments)
        label = known.row.label
        site = sites.site_from(sys._getframe(1).f_back)  # (the code that called into torch)
        return new_record(label, metadata.annotation_of(label, launch), site,
                          metadata.cpu_only_args(launch))


def existing_groups() -> list[Any]:
    """Every process group torch keeps now (c10d's registry of them)."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    world = getattr(c10d, "_world", None)
    names = getattr(world, "pg_names", None)
    return list(names) if isinstance(names, dict) else []


def group_creation_wrapper(agent: Any) -> Any:
    """``_new_process_group_helper``'s wrapper: a group gets the agent's hooks as it is made,
    before any thread can issue a collective on it."""

    def made(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        result = wrapped(*args, **kwargs)
        hooks = agent.hooks
        if hooks is not None:
            hooks.hook_groups([result[0] if isinstance(result, tuple) and result else result])
        return result

    return made

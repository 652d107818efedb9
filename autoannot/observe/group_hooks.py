"""Torch's process-group hooks as the observer of every launch no proxy sees, where torch has
them (``ProcessGroup.register_pre_hook`` / ``register_post_hook``, torch >= 2.14).

Torch fires a group's hooks from its ``c10d::`` kernels, around every collective issued
through the group: the Python API's, ``pg.allreduce(...)``, DDP's reducer, compiled code,
batched p2p and coalesced blocks, on NCCL and gloo. Where torch has them they are the agent's
only observer below the Python API. They need no dispatch key and no RecordFunction callback.
``AUTOANNOT_GROUP_HOOKS=0`` keeps the older observers instead.

Where the native module is built for this torch (``autoannot build-native``) its hooks, in C++,
are registered in place of Python's (``native/ring_hooks.cpp``): with one ring and nothing else
open (the always-on recorder) they write a launch of a kind and from a call site seen before to
the ring themselves, with no Python call and no Python object made; anything else they hand to
this observer's hooks, as torch's Python hooks would. ``AUTOANNOT_NATIVE=0`` keeps Python's.

Torch asks that hooks be registered at setup time, not while collectives run: a hook added or
removed while another thread issues a collective on the group can crash the process. So each
group gets the agent's hooks once, when it is made, and they come off at the interpreter's
exit. The groups that exist at ``enable()`` get them then; a group made later gets them from
the wrapper of ``_new_process_group_helper``, the one function torch makes groups through
(torch gives no public notice of a new group). While nothing asks for launches, the hooks
return at once.

While a capture, a record file, a ring or a ``record()`` that wants these launches is open, a
launch is handed to the route (``keep.route``) as it is entered, at the pre-hook, and ended
once it was issued, at the post-hook. A launch made inside
a proxied call belongs to the proxy, so no launch is annotated twice.

A hook is told the op's kind, its tensors and its root or peer, but not the op. Where Python
called the op through ``torch.ops`` (compiled code, funcol's ops), the op and its arguments are
read from the frame of torch's ``OpOverload.__call__``, without changing it. Otherwise (C++
callers such as DDP's reducer; ``pg.*`` calls) the launch is derived by the table's rule for
the ``c10d::`` op it came through: torch 2.15's hooks name that op, and on 2.14 it is read from
the tensors (see ``_op_of_kind``). What a hook is not told is left out, never invented: an
``all_to_all_single``'s split sizes are not in its annotation.
"""

from __future__ import annotations

import atexit
import functools
import sys
import threading
import weakref
from _thread import get_ident
from typing import Any

from autoannot.base import diagnostics, features
from autoannot.describe import ops, sites
from autoannot.describe import vocabulary as V
from autoannot.describe.kinds import Kind, Kinds, kind_of

#: The id autoannot's hooks are registered under on every group ("auta").
HOOK_ID = 0x61757461
#: Launches given to the journals whose post-hook has not come (a collective that raised):
#: at most this many are kept.
PENDING_LIMIT = 1024


#: What a launch "returned" at its post-hook: it was issued, its stream not made to wait for it
#: (no GPU end to be had; no Work whose completion a ring could ask for).
ISSUED = object()


def available() -> bool:
    """Whether this torch's process groups take pre/post collective hooks."""
    return features.group_hooks_available()


def observe(settings: Any) -> bool:
    """Whether the hooks are the observer below the Python API with these settings
    (``config.Config``): this torch's groups take them and ``AUTOANNOT_OPS`` and
    ``AUTOANNOT_GROUP_HOOKS`` allow them."""
    return settings.ops and settings.group_hooks and available()


def _op_of_kind(kind: str, inputs: list[Any], outputs: list[Any]) -> str:
    """The op a torch 2.14 hook's kind of launch came through, by its tensors: its hooks name
    the kind (``ALLGATHER``) where later ones name the op (``ALLGATHER_BASE``). One tensor in
    and one out is ambiguous: an all-gather or reduce-scatter of one tensor is read as the
    coalesced form funcol and compiled code launch (the plain ``_allgather_base`` comes from
    the Python API, which the proxies see); an all-reduce of one tensor as the plain form."""
    one_in, one_out = len(inputs) == 1, len(outputs) == 1
    if kind == "ALLREDUCE":
        return kind if one_in else "ALLREDUCE_COALESCED"
    if kind == "ALLGATHER":
        if one_in and not one_out:
            return kind
        return ("ALLGATHER_INTO_TENSOR_COALESCED" if len(outputs) == len(inputs)
                else "ALLGATHER_COALESCED")
    if kind == "REDUCE_SCATTER":
        if one_out and not one_in:
            return kind
        return "REDUCE_SCATTER_TENSOR_COALESCED"
    if kind == "ALLTOALL":
        return "ALLTOALL_BASE" if one_in and one_out else kind
    return kind


def _op_call(name: str, inputs: list[Any], outputs: list[Any], root: int, size: int
             ) -> tuple[str, dict[str, Any]] | None:
    """The ``c10d::`` op a hook's launch came through (``name``: the op's hook name, as torch
    2.15 gives it), and its arguments by name (as far as the hook tells them); None for one
    that launches no collective (a split, a window)."""
    if name == "ALLREDUCE":
        return "c10d::allreduce_", {"tensors": inputs}
    if name == "ALLREDUCE_COALESCED":
        return "c10d::allreduce_coalesced_", {"tensors": inputs}
    if name == "BROADCAST":
        return "c10d::broadcast_", {"tensors": inputs, "root_rank": root, "root_tensor": 0}
    if name == "REDUCE":
        return "c10d::reduce_", {"tensors": inputs, "root_rank": root, "root_tensor": 0}
    if name == "ALLGATHER_BASE":
        return "c10d::_allgather_base_", {"output_tensor": outputs[0], "input_tensor": inputs[0]}
    if name == "ALLGATHER":
        return "c10d::allgather_", {
            "output_tensors": [outputs[i:i + size] for i in range(0, len(outputs), size)],
            "input_tensors": inputs}
    if name == "ALLGATHER_INTO_TENSOR_COALESCED":
        return "c10d::allgather_into_tensor_coalesced_", {"outputs": outputs, "inputs": inputs}
    if name == "ALLGATHER_COALESCED":
        return "c10d::allgather_coalesced_", {
            "output_lists": [outputs[i:i + size] for i in range(0, len(outputs), size)],
            "input_list": inputs}
    if name == "REDUCE_SCATTER_BASE":
        return "c10d::_reduce_scatter_base_", {"output_tensor": outputs[0],
                                               "input_tensor": inputs[0]}
    if name == "REDUCE_SCATTER":
        return "c10d::reduce_scatter_", {
            "output_tensors": outputs,
            "input_tensors": [inputs[i:i + size] for i in range(0, len(inputs), size)]}
    if name == "REDUCE_SCATTER_TENSOR_COALESCED":
        return "c10d::reduce_scatter_tensor_coalesced_", {"outputs": outputs, "inputs": inputs}
    if name == "ALLTOALL_BASE":  # (the hooks carry no split sizes: left out, see _UNTOLD)
        return "c10d::alltoall_base_", {"output": outputs[0], "input": inputs[0],
                                        "output_split_sizes": [], "input_split_sizes": []}
    if name == "ALLTOALL":
        return "c10d::alltoall_", {"output_tensors": outputs, "input_tensors": inputs}
    if name == "BARRIER":
        return "c10d::barrier", {}
    if name == "SEND":
        return "c10d::send", {"tensors": inputs, "dst": root, "tag": 0}
    if name == "RECV":
        return "c10d::recv_", {"tensors": outputs or inputs, "src": root, "tag": 0}
    if name == "GATHER":
        return "c10d::gather_", {
            "output_tensors": [outputs] if outputs else [], "input_tensors": inputs,
            "root_rank": root}
    if name == "SCATTER":
        return "c10d::scatter_", {"output_tensors": outputs,
                                  "input_tensors": [inputs] if inputs else [], "root_rank": root}
    return None


_NAMES: dict[Any, str] = {}  # HookOpName -> its name ("ALLREDUCE")


@functools.cache
def _names_ops(names: type) -> bool:
    """Whether this torch's hooks name the op (2.15: ``ALLGATHER_BASE``), not only its kind."""
    return hasattr(names, "ALLGATHER_BASE")
#: Fields a hook is not told, by the op it derives a launch by: left out of the annotation.
_UNTOLD = {"c10d::alltoall_base_": (V.IN_SPLIT, V.OUT_SPLIT)}


class HookObserver:
    """The agent's hooks on every group, annotating the launches no proxy sees while
    something asks. ``agent``: the ``Instrumentation`` (its ``state``, ``captures``);
    ``native``: the native module whose hooks are registered in place of Python's (None:
    Python's)."""

    def __init__(self, agent: Any, native: Any = None) -> None:
        self.agent = agent
        self.native = native
        self._ops: dict[str, Any] | None = None  # (at the first launch: torch may be importing)
        self._groups: dict[int, weakref.ref] = {}  # id -> the groups hooked now
        #: (group, op id) -> the launch the route entered at its pre-hook, until its post-hook
        self._pending: dict[tuple[int, int], Any] = {}
        self._lock = threading.Lock()
        #: Kinds of launch derived, by key (a group's id among it).
        self._kinds = Kinds()
        self.on = False
        if native is not None:
            from autoannot.describe import groups

            native.set_site_resolver(sites.SITES, sites.site_from, sites.LIBRARY_FILES)
            native.set_hook_python(self._before_native, self._after, agent.state.inside,
                                   _op_call_codes())
            groups.on_group_gone(native.forget_hook_keys)  # (a key holds a group's id)
        atexit.register(self.unhook_all)

    def __repr__(self) -> str:
        return f"HookObserver(on={self.on}, groups={len(self._groups)})"

    @property
    def kinds_let_go(self) -> int:
        """Kinds let go so far (counted, for the tests)."""
        return self._kinds.let_go

    @property
    def groups_hooked(self) -> int:
        """The groups carrying the agent's hooks now."""
        return len(self._groups)

    # what the agent's state asks for ------------------------------------------------------

    def demand_changed(self, state: Any) -> None:
        """(``State`` listener, under its lock) Whether the hooks annotate: while a capture, a
        journal, or a recorder that wants launches no proxy sees is open."""
        on = state.live and (state.captures > 0 or bool(state.journals)
                             or any(not r.python_api_only for r in state.recorders))
        if not on:
            self.let_go()
        self.on = on
        if self.native is not None:
            self.native.set_hook_mode(2 if on and state.route.ring_alone else 1 if on else 0)

    def let_go(self) -> None:
        """Leave the contexts of launches whose post-hook never came (a collective that
        raised), most recent first: none stays entered once nothing asks (or a capture ends)."""
        pending, self._pending = self._pending, {}
        for entered in reversed(list(pending.values())):
            entered.failed(RuntimeError("no post-hook"))  # (it did not return)

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
            if self.native is not None:
                self.native.hook_group(group, key, HOOK_ID)
            else:
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
            native = self.native
            if native is not None:
                native.set_hook_python(None, None, None, [])  # (mode 0: no Python call)
            for ref in list(self._groups.values()):
                group = ref()
                if group is None:
                    continue
                try:
                    if native is not None:
                        native.unhook_group(group, HOOK_ID)
                    else:
                        group.unregister_pre_hook(HOOK_ID)
                        group.unregister_post_hook(HOOK_ID)
                except Exception:  # a group torch has shut down: nothing to remove
                    pass
            self._groups.clear()

    # the hooks ----------------------------------------------------------------------------

    def _before(self, ref: weakref.ref, args: Any, native: bool = False) -> Any:
        """(torch's pre-hook) A launch about to be issued: handed to the route. ``native``:
        called by the native hooks, told what to do at the post-hook: None nothing, True call
        ``_after``, (kind id, slot) the launch went to the native writer's ring alone by its
        hooked kind (it ends it, and writes the next launches of that key itself)."""
        if not self.on:  # (nothing asks: at once)
            return None
        state = self.agent.state
        if state.inside.get(get_ident()):  # a proxy's launch: the proxy's
            return None
        group = ref()
        try:
            found = self._kind_and_caller(group, args, native)
        except Exception as exc:  # this launch goes unannotated; the collective runs
            diagnostics.warn_once(f"c10d.{getattr(args.name, 'name', args.name)}",
                                  "deriving the collective metadata", exc)
            return None
        if found is None:
            return None
        kind, caller, hooked = found
        route = state.route
        site = sites.site_from(caller)
        if native:  # (the native writer's where it writes the ring alone: by it from now on)
            try:
                written = route.for_native(kind, site, self.native)
            except Exception as exc:
                diagnostics.warn_once(kind.label, "writing the launch to the ring", exc)
                return None
            if written is not None:
                return written if hooked else None
        cuda = False
        if route.timing:  # (timed on the GPU where a ring asks: its start; its stream does not
            inputs = args.input_tensors  # wait for it at the post-hook: no end)
            cuda = route.on_gpu(kind, (inputs or args.output_tensors,), {})
        entered = route.entered(kind, site, python_api=False, cuda=cuda)  # (below the API)
        if entered is None:  # (said)
            return None
        pending = self._pending
        if len(pending) >= PENDING_LIMIT:  # (launches that raised: let go)
            self.let_go()
            pending = self._pending
        pending[(id(group), args.op_id)] = entered
        return True

    def _before_native(self, key: int, args: Any) -> Any:
        """(The native pre-hook) a launch it does not write itself (see ``_before``)."""
        ref = self._groups.get(key)
        return None if ref is None else self._before(ref, args, native=True)

    def _after(self, key: int, args: Any) -> None:
        """(torch's post-hook; the native one's too) The launch was issued: the route's entry of
        it ended (its ledger, the recorders; the rings' records)."""
        entered = self._pending.pop((key, args.op_id), None)
        if entered is not None:
            entered.returned(False, ISSUED)

    def _kind_and_caller(self, group: Any, args: Any, native: bool = False
                         ) -> tuple[Kind, Any, bool] | None:
        """One hooked launch's kind, the Python frame that called into torch (None: no
        Python caller) and whether the kind is the hook's (not an op's called through
        ``torch.ops``); None where it is no collective."""
        if group is None:
            return None
        if self._ops is None:
            self._ops = ops.table_ops()
        # (the Python code that called into torch, if any: past ``_before_native`` too)
        caller = sys._getframe(2 if native else 1).f_back
        called = _op_called_from(caller)
        known = self._ops.get(called[0]) if called is not None else None
        hooked = known is None or known.plan is None
        if not hooked:  # torch.ops.*: the op itself
            kind = self._kind_of_call(known, called[1], called[2])
            caller = caller.f_back
        else:  # what the hook tells
            kind = self._kind_of_hooked(group, args)
        if kind is None:
            return None
        return kind, caller, hooked

    def _kind_of_call(self, known: ops.Op, op_args: tuple, op_kwargs: dict) -> Kind | None:
        plan = known.plan
        key = plan.key_of(op_args, op_kwargs)  # (one plan's: the op joins it)
        return self._kinds.found_or_kept(
            None if key is None else (known.row.label, key),
            lambda: kind_of(known.row.label, plan.derive(op_args, op_kwargs)))

    def _kind_of_hooked(self, group: Any, args: Any) -> Kind | None:
        # The key, read once from the hook's arguments (each read converts from C++): one
        # tensor in and none out (DDP's all-reduces), or one out, the same (an all-reduce's
        # through the Python API) or another, or lists: the shapes of key never equal each
        # other (a dtype is no tuple; their lengths differ).
        inputs, outputs = args.input_tensors, args.output_tensors
        name, root = args.name, args.root
        if len(inputs) == 1 and len(outputs) <= 1:
            tensor = inputs[0]
            out = outputs[0] if outputs else None
            if out is None:
                key: tuple = (name, id(group), root, tensor.dtype, tensor.shape, None)
            elif out is tensor:
                key = (name, id(group), root, tensor.dtype, tensor.shape)
            else:
                key = (name, id(group), root, tensor.dtype, tensor.shape, out.dtype, out.shape)
        else:
            key = (name, id(group), root, tuple((t.dtype, t.shape) for t in inputs),
                   tuple((t.dtype, t.shape) for t in outputs))
        kinds = self._kinds
        kind = kinds.by_key.get(key)
        if kind is None:
            kind = kinds.keep(key, self._derive_hooked(group, name, root, inputs, outputs))
        return kind

    def _derive_hooked(self, group: Any, hooked_name: Any, root: int, inputs: list[Any],
                       outputs: list[Any]) -> Kind | None:
        """The kind of a hooked launch not seen before (None: no collective of the table)."""
        name = _NAMES.get(hooked_name)
        if name is None:
            name = _NAMES[hooked_name] = getattr(hooked_name, "name",
                                                 str(hooked_name).split(".")[-1])
        if not _names_ops(type(hooked_name)):
            name = _op_of_kind(name, inputs, outputs)
        call = _op_call(name, inputs, outputs, int(root), group.size())
        if call is None:
            return None
        op, arguments = call
        known = self._ops.get(op)
        if known is None or known.plan is None:
            return None
        arguments["process_group"] = group.boxed()  # (as the dispatcher passes it)
        return kind_of(known.row.label, known.plan.derive((), arguments),
                       untold=_UNTOLD.get(op, ()))


_OP_CALLS: list[Any] = []  # the code of OpOverload.__call__, .redispatch, the packet's call


def _op_call_codes() -> list[Any]:
    """The code objects of torch's ``OpOverload.__call__`` and ``redispatch`` and its packet's
    call (None for one this torch lacks)."""
    if not _OP_CALLS:
        ops = sys.modules.get("torch._ops")
        for kind, method in (("OpOverload", "__call__"), ("OpOverload", "redispatch"),
                             ("OpOverloadPacket", "__call__")):
            found = getattr(ops, kind, None)
            function = vars(found).get(method) if isinstance(found, type) else None
            _OP_CALLS.append(getattr(function, "__code__", None))
    return _OP_CALLS


def _op_called_from(frame: Any) -> tuple[str, tuple, dict] | None:
    """Where Python called the launch's op through ``torch.ops`` (compiled code, funcol's
    ops and their autograd, a ``torch.ops.c10d.*`` call), that op's name and its arguments:
    read (never changed) from the frame of torch's ``OpOverload.__call__`` or ``redispatch``
    (or its packet's call, for an op of one overload). It tells what the hook does not: the
    ``_c10d_functional`` op over the ``c10d::`` one, an all-to-all's split sizes."""
    if frame is None:
        return None
    if not _OP_CALLS:
        _op_call_codes()
    code = frame.f_code
    if code is not _OP_CALLS[0] and code is not _OP_CALLS[1] and code is not _OP_CALLS[2]:
        return None  # (by identity: a code object's == compares its names and constants)
    values = frame.f_locals
    op, op_args, op_kwargs = values.get("self"), values.get("args"), values.get("kwargs")
    if not (isinstance(op_args, tuple) and isinstance(op_kwargs, dict)):
        return None
    if code is _OP_CALLS[2]:  # a packet: the op, where it has one overload
        if op.overloads() != ["default"]:
            return None
        op = op.default
    return op.name(), op_args, op_kwargs


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

"""The native observer as the agent drives it: launches no proxy sees (DDP's reducer, autograd's
threads, compiled code, C++), seen through torch's RecordFunction callbacks (see
``native/observer.cpp``).

* In a capture it notes launches in C++ (the process group's Work range and torch's own record
  of the launch, ``ParamCommsDebugInfo``: no operator pays anything); they join the graph's
  ledger when the capture ends (``capture_ended``).
* While a recorder or journal is open it asks for every operator (their RecordFunction, with
  inputs) and calls ``_told`` with each launch: records and journal lines at once.

A launch is described by torch's record of it (the eager fields, exact by construction) or,
where the process group makes none (gloo), by its operator's arguments, which the table derives
(``metadata.Plan``); each kind of launch is derived once.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any, NamedTuple

from autoannot import collectives, diagnostics, groups, metadata, native, sites
from autoannot.records import enter, new_record, publish


class Derived(NamedTuple):
    """What a kind of launch gets, derived once."""

    label: str
    annotation: dict[str, Any]
    kernels: tuple[str, ...]
    cpu_only: dict[str, Any]
    launch: metadata.Launch


class _Op(NamedTuple):
    row: collectives.Collective
    plan: metadata.Plan | None
    keyword_only: tuple[str, ...]
    read: list[int]  # positions of the arguments its metadata is read from


#: Kinds derived before the observer forgets its own and Python lets go of the generation
#: before (so at most twice this many are kept, in C++ and in Python together).
CACHE_SIZE = 4096


def _ops() -> dict[str, _Op]:
    """``"c10d::allreduce_"`` -> its row, plan and argument positions, for every op of the
    table this torch has (``c10d::`` and ``_c10d_functional::``)."""
    import torch

    ops = {}
    for row in collectives.COLLECTIVES:
        if row.module not in collectives.OP_MODULES:
            continue
        namespace = getattr(torch.ops, "c10d" if row.module == collectives.PG_OPS
                            else "_c10d_functional")
        try:
            op = getattr(namespace, row.api).default
        except AttributeError:  # not in this torch
            continue
        arguments = [arg.name for arg in op._schema.arguments]
        read = {row.group_param, row.inputs, row.outputs, *row.root_params, *row.split_params}
        keyword_only = tuple(arg.name for arg in op._schema.arguments if arg.kwarg_only)
        ops[op.name()] = _Op(row, metadata.Plan(row, op), keyword_only,
                             [i for i, name in enumerate(arguments) if name in read])
    return ops


def _collective_ops(ops: dict[str, _Op]) -> dict[str, str]:
    """Each eager collective name -> the ``c10d::`` op that launches it (a launch seen only by
    its process group's record is labelled by it)."""
    found: dict[str, str] = {}
    for name, op in ops.items():
        if op.row.module == collectives.PG_OPS and op.row.eager_name:
            found.setdefault(op.row.eager_name, name)
    return found


class NativeObserver:
    """The native module, told what the agent's state asks for, and what it sees turned into
    ledger entries and records. ``agent``: the ``Instrumentation`` (its ``state``)."""

    def __init__(self, module: Any, agent: Any) -> None:
        self.module = module
        self.agent = agent
        self.order = module.order  # launches noted so far (read with no call)
        self._ops = _ops()
        # kind id (or (id, label)) -> what it derives; bounded (``_let_go_of_kinds``)
        self._kinds: dict[Any, Derived | None] = {}
        self._generation = 0  # ids below this: kinds the observer forgot a generation ago
        self._derived_since = 0  # kinds derived since the observer last forgot its kinds
        self.kinds_let_go = 0  # (counted, for the tests)
        self._needs_operators: bool | None = None
        module.observe_ops(list(self._ops), [op.read for op in self._ops.values()],
                           _collective_ops(self._ops))
        module.set_site_resolver(sites.SITES, sites.site_from)
        module.set_listener(self._told)
        # a group gone: its address may be reused, launches described by it get new kinds
        groups.on_group_gone(module.forget_kinds)
        groups.on_group_gone(module.forget_handed)  # (the proxies' C wrappers key by group id)
        atexit.register(self.at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.after_fork_in_child)

    def __repr__(self) -> str:
        return f"NativeObserver({len(self._ops)} ops, registered={self.module.registered()})"

    # what the agent's state asks for ------------------------------------------------------

    def demand_changed(self, state: Any) -> None:
        """(``State`` listener, under its lock) Register the callback while a capture, a
        recorder that wants launches no proxy sees, or a journal is open; hand the proxies'
        captured launches to it while captures are the only demand."""
        live = state.live
        capturing = live and state.captures > 0
        journaling = live and bool(state.journals)
        recording = live and (any(not r.python_api_only for r in state.recorders)
                              or (journaling and self._journal_needs_operators()))
        self.module.set_demand(capturing, recording, journaling)
        self.module.set_handoff(
            capturing and not state.recorders and not state.journals and not state.blocks
            and self.agent.captures.torch_marks is None)

    def _journal_needs_operators(self) -> bool:
        """Whether a journal asks for every operator, as a recorder does: where the job's
        groups can only be gloo's — no NCCL in this torch, or no NVIDIA GPU on this machine —
        which make no record of a launch for the Work ranges to read (C++-origin launches,
        such as a backward's, would go unwritten). Asked of the system, not of CUDA: nothing
        is initialized (a job may still set CUDA_VISIBLE_DEVICES after importing torch)."""
        if self._needs_operators is None:
            import torch.distributed as dist

            self._needs_operators = not dist.is_nccl_available() or not _nvidia_gpus()
        return self._needs_operators

    def at_exit(self) -> None:
        """At the interpreter's exit: the callback off, before Python finalizes (a launch
        from C++ after that — a group torn down at exit — would call into a Python that is
        going away)."""
        try:
            self.module.set_demand(False, False, False)
            self.module.set_listener(None)
        except Exception:  # (exit goes on)
            pass

    def after_fork_in_child(self) -> None:
        """In a forked child (a DataLoader worker): only what it can still use. Its parent's
        captures and recorders are not its own (what it would record never reaches them): the
        callback asks for nothing but the record file's launches (it writes by process). It
        stays registered with torch: taking it off takes torch's callback lock, which another
        thread of the parent may have held at ``fork()`` (a child hung on it)."""
        state = self.agent.state
        try:
            self.module.set_demand_in_forked_child(state.live and bool(state.journals))
        except Exception as exc:
            diagnostics.warn_once("native observer", "leaving a forked child's demand", exc)

    # captures ----------------------------------------------------------------------------

    def capture_began(self) -> int | None:
        """A capture begins on this thread: the id its launches are noted by (None: this
        thread's stream is in no capture the driver knows of)."""
        self.module.forget_streams()  # (a stream it knew may be in this capture now)
        return self.module.current_capture()

    def capture_ended(self, capture: int, last: bool) -> list[tuple]:
        """The launches noted in a capture, as a ledger's ``(api, annotation, kernels, call
        site, order)``; ``last``: no other capture is in progress (notes no ledger will claim,
        from a capture begun without the agent's wrappers, are let go)."""
        module = self.module
        module.forget_streams()  # (the streams of this capture are in none now)
        noted, derive = module.drain(capture)
        launched = noted if not derive else self._ledger_entries(noted)
        if last:
            module.drain(-1)
        return launched

    def _ledger_entries(self, noted: list[tuple]) -> list[tuple]:
        """Drained notes as ledger entries: those keyed by a proxy's C wrapper are already."""
        launched = []
        for note in noted:
            if len(note) == 5:  # (label, annotation, kernels, site, order)
                launched.append(note)
                continue
            order, op, kind, described, label, site = note
            derived = self._derived(op, kind, described)
            if derived is None:
                continue
            annotation = derived.annotation
            if label is not None and label != derived.label:  # a proxy's launch, handed off
                annotation = self._relabeled(kind, label, derived)
            launched.append((label or derived.label, annotation, derived.kernels,
                             sites.NATIVE_CALLER if site is None else site, order))
        return launched

    # recorders and journals --------------------------------------------------------------

    def _told(self, when: int, op: str, kind: int, described: Any, site: str | None,
              label: str | None) -> bool:
        """(Called by the observer, with the GIL) A launch entered (0: to the journals) or
        returned (1: to the recorders). True: its kind is known here from now on."""
        derived = self._derived(op, kind, described)
        if derived is None:
            return False
        state = self.agent.state
        if site is None:  # the Python code that called into C++ (none on autograd's threads)
            site = sites.site_from(sys._getframe(0).f_back)
        annotation = derived.annotation
        if label is not None and label != derived.label:
            annotation = self._relabeled(kind, label, derived)
        record = new_record(label or derived.label, annotation, site, derived.cpu_only)
        if when == 0:
            enter(state, record)
        else:
            publish(state, record, python_api=False)
        return bool(kind)

    # deriving ----------------------------------------------------------------------------

    def _derived(self, op: str, kind: int, described: Any) -> Derived | None:
        """A kind of launch, derived once (``described``: how the observer describes it the
        first time; None after). None where it cannot be derived (said once)."""
        if kind and described is None:
            return self._kinds.get(kind)
        known = self._ops.get(op)
        row = known.row if known is not None else None
        label = row.label if row is not None else op.replace("::", ".")
        try:
            if described is None:
                raise LookupError(f"{op}: no description of this launch")
            how, what = described
            if how == "fields":
                launch = metadata.launch_of_record(what, row)
            else:
                if known is None or known.plan is None:
                    raise LookupError(f"{op} is not in the table")
                args = [native.stand_in(value) for value in what]
                split = len(args) - len(known.keyword_only)
                launch = known.plan.derive(
                    tuple(args[:split]), dict(zip(known.keyword_only, args[split:], strict=True)))
            derived: Derived | None = Derived(
                label, metadata.annotation_of(label, launch), launch.kernels,
                metadata.cpu_only_args(launch), launch)
        except Exception as exc:  # this launch goes unannotated
            diagnostics.warn_once(label, "deriving the collective metadata", exc)
            derived = None
        if kind:
            self._derived_since += 1
            if self._derived_since >= CACHE_SIZE:
                self._let_go_of_kinds()
            self._kinds[kind] = derived
        return derived

    def _let_go_of_kinds(self) -> None:
        """Keep what Python derived bounded (a job whose sizes keep changing, MoE all-to-all,
        makes new kinds for good): the observer forgets the kinds it knows (launches get new
        ones, described afresh), and Python lets go of those it forgot the time before — not
        of these: a launch under way on another thread may still tell one by its id. Where a
        note waits in a capture, nothing is forgotten yet (its kind must stay known)."""
        boundary = self.module.forget_kinds(if_idle=True)
        if boundary < 0:
            return
        older = self._generation
        kept = {key: derived for key, derived in self._kinds.items()
                if (key[0] if type(key) is tuple else key) >= older}
        self.kinds_let_go += len(self._kinds) - len(kept)
        self._kinds = kept
        self._generation = boundary
        self._derived_since = 0

    def _relabeled(self, kind: int, label: str, derived: Derived) -> dict[str, Any]:
        """The annotation of a kind named by a proxy's label (once per kind and label)."""
        key = (kind, label)
        found = self._kinds.get(key) if kind else None
        if found is None:
            found = derived._replace(label=label, annotation=metadata.annotation_of(
                label, derived.launch))
            if kind:
                self._kinds[key] = found
        return found.annotation


def _nvidia_gpus() -> bool:
    """Whether the NVIDIA driver lists a GPU on this machine (Linux's /proc; elsewhere: taken
    as yes, as before)."""
    import os

    listing = "/proc/driver/nvidia/gpus"
    if os.path.isdir(listing):
        return bool(os.listdir(listing))
    return not os.path.isdir("/proc")  # a Linux machine without the NVIDIA driver: none


def create(agent: Any) -> NativeObserver | None:
    """The observer where it is built for this torch and ``AUTOANNOT_NATIVE`` is on; else None
    (a failure to load it is said once)."""
    if not agent.config.native:
        return None
    try:
        module = native.load()
        return None if module is None else NativeObserver(module, agent)
    except Exception as exc:  # the Python layer annotates these launches instead
        diagnostics.warn_once("native observer", "loading", exc)
        return None

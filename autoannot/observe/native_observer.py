"""The native observer as the agent drives it: launches no proxy sees (DDP's reducer, autograd's
threads, compiled code, C++), seen through torch's RecordFunction callbacks (see
``native/observer.cpp``).

* In a capture it notes launches in C++ (the process group's Work range and torch's own record
  of the launch, ``ParamCommsDebugInfo``: no operator pays anything); they join the graph's
  ledger when the capture ends (``capture_ended``).
* While a recorder or journal is open it asks for every operator (their RecordFunction, with
  inputs) and calls ``_told`` with each launch: records and journal lines at once.
* While one ring with files is open and nothing else (the always-on case), the c10d kernels
  (``native/ring_kernels.cpp``) write the launches made below the Python API to the ring
  instead, and no operator pays anything: a launch of a key seen before with no Python call, a
  new key's through ``_kernel_entered`` (its kind derived here, written by the ring).

A launch is described by torch's record of it (the eager fields, exact by construction) or,
where the process group makes none (gloo), by its operator's arguments, which the table derives
(``metadata.Plan``); each kind of launch is derived once.
"""

from __future__ import annotations

import atexit
import os
import sys
from _thread import get_ident
from typing import Any

from autoannot import native
from autoannot.base import diagnostics
from autoannot.describe import groups, kinds, metadata, ops, sites
from autoannot.describe.kinds import Kind, Kinds, kind_of
from autoannot.keep.ledgers import Noted

#: Kinds derived before the observer forgets its own and Python lets go of the generation
#: before (so at most twice this many are kept, in C++ and in Python together).
CACHE_SIZE = kinds.LIMIT


class NativeObserver:
    """The native module, told what the agent's state asks for, and what it sees turned into
    ledger entries and records. ``agent``: the ``Instrumentation`` (its ``state``)."""

    def __init__(self, module: Any, agent: Any) -> None:
        self.module = module
        self.agent = agent
        self.order = module.order  # launches noted so far (read with no call)
        self._ops = ops.table_ops()
        # kind id (or (id, label)) -> its Kind; bounded here (``_let_go_of_kinds``)
        self._kinds = Kinds(limit=None)
        self._generation = 0  # ids below this: kinds the observer forgot a generation ago
        self._derived_since = 0  # kinds derived since the observer last forgot its kinds
        self._needs_operators: bool | None = None
        #: Each thread's launch entered by the route and not returned yet (the callback's and
        #: the c10d kernels' launches: entered and ended on one thread).
        self._entered: dict[int, Any] = {}
        module.observe_ops(list(self._ops), [op.read for op in self._ops.values()],
                           ops.ops_by_collective(self._ops))
        module.set_site_resolver(sites.SITES, sites.site_from, sites.LIBRARY_FILES)
        module.set_listener(self._told)
        # a group gone: its address may be reused, launches described by it get new kinds
        groups.on_group_gone(module.forget_kinds)
        groups.on_group_gone(module.forget_handed)  # (the proxies' C wrappers key by group id)
        self._kernels: list[str] | None = None  # the c10d kernels registered (None: not yet)
        if hasattr(module, "register_ring_kernels"):
            module.set_kernel_entered(self._kernel_entered)
            module.set_ring_kernels_python(self._kernel_ended, agent.state.inside)
            groups.on_group_gone(module.forget_ring_kernel_keys)
        atexit.register(self.at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.after_fork_in_child)

    def __repr__(self) -> str:
        return f"NativeObserver({len(self._ops)} ops, registered={self.module.registered()})"

    # what the agent's state asks for ------------------------------------------------------

    def demand_changed(self, state: Any) -> None:
        """(``State`` listener, under its lock) Register the callback while a capture, a
        recorder that wants launches no proxy sees, or a journal is open (the operators too
        for a ring, which keeps every launch: a hang's culprit may be in DDP's reducer); hand
        the proxies' captured launches to it while captures are the only demand."""
        live = state.live
        capturing = live and state.captures > 0
        kernels = self._ring_kernels_wanted(state)
        if kernels:  # (on before the callback goes: a launch between is claimed, not twice)
            self.module.set_ring_kernels_mode(2)
        journaling = live and bool(state.journals) and not kernels
        recording = live and (any(not r.python_api_only for r in state.recorders)
                              or (journaling and (self._journal_needs_operators() or any(
                                  getattr(j, "every_launch", False) for j in state.journals))))
        self.module.set_demand(capturing, recording, journaling)
        if not kernels and self._kernels:  # (off once the callback is back)
            self.module.set_ring_kernels_mode(0)
            if not live:  # disable(): torch's dispatcher as it was
                self.module.unregister_ring_kernels()
                self._kernels = None
        self.module.set_handoff(
            capturing and not state.recorders and not state.journals and not state.blocks
            and self.agent.captures.torch_marks is None)

    def _ring_kernels_wanted(self, state: Any) -> bool:
        """Whether the c10d kernels write the launches below the Python API now: one ring with
        files open and nothing else (no capture, recorder or coalescing block), where this
        module has them; registered at the first such moment (and kept until ``disable()``)."""
        if not (state.route.ring_alone and hasattr(self.module, "register_ring_kernels")):
            return False
        if self._kernels is None:
            self._kernels = self._register_kernels()
        return bool(self._kernels)

    def _register_kernels(self) -> list[str]:
        """The c10d kernels on torch's dispatcher: the ops registered; none where another
        kernel is on one of them at their key (the kernels then come off at once, said once:
        the operators' callback serves the ring, as it did before them)."""
        names = [name for name in self._ops if name.startswith("c10d::")]
        try:
            registered, taken = self.module.register_ring_kernels(names)
        except Exception as exc:
            diagnostics.warn_once("the c10d kernels", "registering", exc)
            return []
        if taken:
            self.module.unregister_ring_kernels()
            diagnostics.say_once(
                "ring kernels", "autoannot: the ring's launches below the Python API are seen "
                "through the native observer's callback on every operator: another kernel is "
                f"on torch's BackendSelect key for {', '.join(sorted(taken))}")
            return []
        return list(registered)

    def _kernel_entered(self, op: str, kind_id: int, described: Any,
                        site: str) -> tuple[int, int] | bool:
        """(Called by the c10d kernels, with the GIL) A launch of a key they have not seen
        (for this ring's attach): written to the ring here. Its ids in the ring (kind, group
        slot) where the native writer wrote it (the kernels write that key's launches from
        now on, and end this one); True where Python wrote it (``_kernel_ended`` ends it);
        False where it was not written."""
        kind = self._kind(op, kind_id, described, None)
        if kind is None:
            return False
        route = self.agent.state.route
        ids = route.for_native(kind, site, self.module)
        if ids is not None:
            return ids
        entered = route.entered(kind, site, python_api=False)
        if entered is None:
            return False
        self._entered[get_ident()] = entered
        return True

    def _kernel_ended(self, failed: bool) -> None:
        """(Called by the c10d kernels, with the GIL) The launch ``_kernel_entered`` handed to
        the route returned (or raised: ``failed``)."""
        entered = self._entered.pop(get_ident(), None)
        if entered is not None:
            if failed:
                entered.failed(RuntimeError("the launch raised"))
            else:
                entered.returned()

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
            if hasattr(self.module, "register_ring_kernels"):
                self.module.set_ring_kernels_python(None, None)
                self.module.set_kernel_entered(None)
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

    def capture_ended(self, capture: int, last: bool) -> list[Noted]:
        """The launches noted in a capture, as its ledger's notes; ``last``: no other capture
        is in progress (notes no ledger will claim, from a capture begun without the agent's
        wrappers, are let go)."""
        module = self.module
        module.forget_streams()  # (the streams of this capture are in none now)
        drained, derive = module.drain(capture)
        launched = drained if not derive else self._notes(drained)
        if last:
            module.drain(-1)
        return launched

    def _notes(self, drained: list[tuple]) -> list[Noted]:
        """Drained notes as a ledger's. The observer drains two shapes: those a proxy's C
        wrapper keyed, in ``Noted``'s shape already (where all are, ``capture_ended`` keeps
        them as drained: no Python call per launch), and those it saw by itself (order, op,
        kind id, description, label, call site), whose kind is derived here."""
        launched = []
        for note in drained:
            if len(note) == len(Noted._fields):
                launched.append(note)
                continue
            order, op, kind_id, described, label, site = note
            kind = self._kind(op, kind_id, described, label)
            if kind is not None:
                launched.append(Noted(kind.label, kind.annotation, kind.kernels,
                                      sites.NATIVE_CALLER if site is None else site, order))
        return launched

    # recorders and journals --------------------------------------------------------------

    def _told(self, when: int, op: str, kind_id: int, described: Any, site: str | None,
              label: str | None) -> bool:
        """(Called by the observer, with the GIL) A launch entered (0) or returned (1), to
        the route (entered, then ended on the same thread). True: its kind is known here from
        now on."""
        kind = self._kind(op, kind_id, described, label)
        if kind is None:
            return False
        if site is None:  # the Python code that called into C++ (none on autograd's threads)
            site = sites.site_from(sys._getframe(0).f_back)
        # (in a capture, the observer notes the launch itself: its ledger has it)
        route = self.agent.state.route
        if when == 0:
            entered = route.entered(kind, site, python_api=False, noted=True)
            if entered is not None:
                self._entered[get_ident()] = entered
        else:
            entered = self._entered.pop(get_ident(), None)
            (entered or route.unentered(kind, site, python_api=False, noted=True)).returned()
        return bool(kind_id)

    # deriving ----------------------------------------------------------------------------

    def _kind(self, op: str, kind_id: int, described: Any, label: str | None) -> Kind | None:
        """A launch's kind, named by ``label`` where a proxy handed it off under its own."""
        kind = self._derived(op, kind_id, described)
        if kind is None or label is None or label == kind.label:
            return kind
        return self._relabeled(kind_id, label, kind)

    def _derived(self, op: str, kind_id: int, described: Any) -> Kind | None:
        """A kind of launch, derived once by the observer's id of it (``described``: how the
        observer describes it the first time; None after). None where it cannot be derived
        (said once)."""
        if kind_id and described is None:
            return self._kinds.get(kind_id)
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
                launch = known.plan.derive(*ops.call_of(known, [native.stand_in(value)
                                                                for value in what]))
            kind: Kind | None = kind_of(label, launch)
        except Exception as exc:  # this launch goes unannotated
            diagnostics.warn_once(label, "deriving the collective metadata", exc)
            kind = None
        if kind_id:
            self._derived_since += 1
            if self._derived_since >= CACHE_SIZE:
                self._let_go_of_kinds()
            self._kinds.keep(kind_id, kind)
        return kind

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
        self._kinds.keep_only(lambda key: (key[0] if type(key) is tuple else key) >= older)
        self._generation = boundary
        self._derived_since = 0

    @property
    def kinds_let_go(self) -> int:
        """Kinds Python let go of so far (counted, for the tests)."""
        return self._kinds.let_go

    def _relabeled(self, kind_id: int, label: str, kind: Kind) -> Kind:
        """A kind named by a proxy's label (derived once per kind and label)."""
        key = (kind_id, label)
        found = self._kinds.get(key) if kind_id else None
        if found is None:
            found = kind_of(label, kind.facts)
            if kind_id:
                self._kinds.keep(key, found)
        return found


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

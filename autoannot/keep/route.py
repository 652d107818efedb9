"""The one route every launch takes: what a launch must do, decided once when the agent's state
changes (a recorder, record file, ring, capture or coalescing block opens or closes), and done
here alone. Every observer hands its launches to the current route (``State.route``), and
nothing else writes a launch to a ring, a record file, a graph's ledger or a recorder.

The rule:

* entered, before it runs: the record file's line (``AUTOANNOT_RECORD``) and each ring's record
  (``AUTOANNOT_RING``, a profiler's window), so a collective that hangs is in the files; in a
  capture where torch records its own annotations (``mark_kernels``), its scope entered;
* returned (or raised): the rings' records ended; once it was issued (not where it raised), its
  graph's ledger (in a capture, unless its observer noted it there itself) and the open
  ``record()`` recorders (those that asked for the Python API's launches only leave out a
  launch made below it);
* inside a ``_coalescing_manager`` block of its thread: no launch of its own; the block's exit
  is the one launch (``in_block``).

How an observer hands it over:

* ``launcher(kinds, how, state)``: the launch function of a proxy's wrapper or a dispatcher
  kernel's, the route's fast method: a launch run whole, made as one (the observers below leave
  it to its caller: ``state.inside``, ``state.exclusion``), its rings, ledger and recorders
  written inline, or by the whole rule (``run_general``) where a record file, torch's marks or
  a block asks;
* ``entered(kind, site, ...)`` then ``returned``/``failed`` on what it gave: a launch seen entering
  and returning apart (torch's group hooks, the annotation context, the native observer's
  callback); ``run_whole``: a call that is one launch (a coalescing block's exit);
* ``for_native``: the launch of a key the native writer does not know yet (its C++ writes those
  after: ``native/ring_hooks.cpp``), written through it and its ids told;
* ``replayed``: each collective of a captured graph's replay.

A failure of the route's own is said once and never reaches the caller: the launch runs.
"""

from __future__ import annotations

import sys
from _thread import get_ident
from collections.abc import Callable
from typing import Any

from autoannot.base.diagnostics import warn_once
from autoannot.describe.metadata import NotALaunch
from autoannot.describe.sites import SITES, call_site, site_from
from autoannot.keep.records import Record

_getframe = sys._getframe
_new_tuple = tuple.__new__  # (a Record without NamedTuple's argument parsing)

#: ``how`` a launch is run, by its observer: made through torch's Python API (else below it: a
#: recorder of the Python API's launches leaves it out), and with the layer below kept out of it
#: (the Python layer's key excluded, or the native observer's call).
PYTHON_API, EXCLUDES = 1, 2


class Entered:
    """A launch entered by a route (``Route.entered``), until it returns: what was written and
    what is to be done at its return."""

    __slots__ = ("kind", "noted", "python_api", "rings", "route", "scope", "site", "timed")

    def __init__(self, route: Route, kind: Any, site: str | None, python_api: bool,
                 noted: bool) -> None:
        self.route, self.kind, self.site = route, kind, site
        self.python_api, self.noted = python_api, noted
        self.scope: Any = None  # torch's mark_kernels scope, while entered
        self.rings: tuple[Any, ...] = ()  # the rings its record was written to
        self.timed: tuple[tuple[Any, Any], ...] = ()  # (ring, its GPU start) where timed

    def returned(self, failed: bool = False, result: Any = None) -> None:
        """It was issued and returned ``result`` (``failed``: it raised; as ``Ring.returned``,
        which a route hands back for a launch its one ring alone keeps)."""
        if failed:
            self.route.ended(self, RuntimeError("the launch raised"))
        else:
            self.route.ended(self, None, result)

    def failed(self, exc: BaseException) -> None:
        """It raised ``exc``: not issued (in no ledger, no recorder)."""
        self.route.ended(self, exc)


class RingEnd:
    """The end of a launch the route's one ring alone keeps (``Route.entered`` in the
    always-on case): no ``Entered`` made, the ring's record ended at once."""

    __slots__ = ("ring",)

    def __init__(self, ring: Any) -> None:
        self.ring = ring

    def returned(self, failed: bool = False, result: Any = None) -> None:
        self.ring.returned(failed, result)

    def failed(self, exc: BaseException | None = None) -> None:
        self.ring.returned(True)


class Route:
    """The route of every launch while the agent's state is what it was made from (``state``:
    the agent's ``State``; ``captures``: its ``Captures``, for the ledgers and torch's marks)."""

    __slots__ = ("below_or_none", "blocks", "calls", "capturing", "files", "general", "inside",
                 "marks", "note", "recorders", "recorders_or_none", "replay_keepers",
                 "ring_alone", "ring_only", "rings", "rings_or_none", "state", "times",
                 "timing", "wanting_below")

    def __init__(self, state: Any, captures: Any = None) -> None:
        self.state = state
        self.inside = state.inside  # (thread ident -> depth: the threads in a launch's call)
        self.calls = state.calls  # (per thread: its open coalescing blocks)
        journals = state.journals
        self.rings = tuple(j for j in journals if getattr(j, "inline", False))
        self.files = tuple(j for j in journals if not getattr(j, "inline", False))
        self.recorders = state.recorders
        self.wanting_below = tuple(r for r in state.recorders if not r.python_api_only)
        #: The same, None where there are none (the launch function tests them so: cheaper).
        self.rings_or_none = self.rings or None
        self.recorders_or_none = self.recorders or None
        self.below_or_none = self.wanting_below or None
        self.capturing = state.captures > 0
        self.blocks = state.blocks > 0
        self.marks = captures.torch_marks if captures is not None and self.capturing else None
        self.note = captures.note if captures is not None else None
        self.replay_keepers = (tuple(r for r in self.rings if getattr(r, "replays", False))
                               if state.live else ())
        #: The rings that time launches on CUDA tensors on the GPU (``keep.gpu_clock``).
        self.timing = tuple(r for r in self.rings if getattr(r, "gpu_source", None) is not None)
        #: Whether a launch's arguments are timed: the first timing ring's source's rule, as it
        #: was when the route was made (a ring's source may be decided since: ``on_gpu``).
        self.times = self.timing[0].gpu_source.times if self.timing else None
        #: Whether a proxy's launch takes the whole rule (``run_general``): a record file,
        #: torch's marks or a block asks; else its rings, ledger and recorders are written by
        #: its launch function (``launcher``: the route's fast method).
        self.general = (bool(self.files) or self.marks is not None or self.blocks
                        or bool(self.timing))
        #: The end of a launch entered apart where one ring is all that asks for it (no record
        #: file, recorder, capture or block): ``entered`` writes the ring and hands it back,
        #: made once a route (``RingEnd``); else None.
        self.ring_only = (RingEnd(self.rings[0]) if len(self.rings) == 1 and not (
            self.files or self.recorders or self.capturing or self.blocks or self.timing)
            else None)
        #: Whether one ring with files is all that is open (no record file, recorder, capture
        #: or block): then the native writer may write launches itself (``for_native``).
        self.ring_alone = (state.live and len(self.rings) == 1 and self.rings[0].folder is not None
                           and not (self.files or self.recorders or self.capturing
                                    or self.blocks or self.timing))

    def __repr__(self) -> str:
        open_ = [name for name, on in (("rings", self.rings), ("files", self.files),
                                       ("recorders", self.recorders),
                                       ("capture", self.capturing), ("blocks", self.blocks))
                 if on]
        return f"Route({', '.join(open_) or 'nothing open'})"

    # a launch run whole (the proxies' wrappers, the dispatcher kernels) -----------------------

    def run_general(self, kind: Any, frame: Any, how: int, wrapped: Callable[..., Any],
                    args: tuple, kwargs: dict) -> Any:
        """A proxy's launch where a record file, torch's marks or a coalescing block asks: the
        launch entered and ended as the rule says (``run_whole``), or a block's part."""
        __tracebackhide__ = True
        if self.blocks and self.calls.blocks:  # in a _coalescing_manager block: the launch
            self.calls.blocks[-1].launches.append(kind.facts)  # is the block's
            return one_launch(self.state, how, wrapped, args, kwargs)
        return self.run_whole(kind, site_from(frame), bool(how & PYTHON_API), one_launch,
                              self.state, how, wrapped, args, kwargs,
                              cuda=self.times is not None and self.on_gpu(kind, args, kwargs))

    def on_gpu(self, kind: Any, args: tuple, kwargs: dict) -> bool:
        """Whether a launch with these arguments is timed on the GPU (a ring times the GPU and
        its tensors are on one); a failure of the rule is said once: not timed."""
        times = self.times
        if times is None:
            return False
        try:
            return bool(times(args, kwargs))
        except Exception as exc:
            warn_once(kind[0], "asking whether the launch runs on a GPU", exc)
            return False

    def run_whole(self, kind: Any, site: str | None, python_api: bool,
                  call: Callable[..., Any], *call_args: Any, cuda: bool = False) -> Any:
        """One launch, from entry to return: ``call(*call_args)`` runs it, and returns or raises
        what it does (``cuda``: on CUDA tensors, timed on the GPU where a ring asks); a failure
        of the route's own is said once and never reaches the caller (the launch still
        runs)."""
        __tracebackhide__ = True
        entered = self.entered(kind, site, python_api, cuda=cuda)
        if entered is None:  # (the route failed it: said) outside the except block, so the
            result = call(*call_args)  # caller's exception carries none of ours
            self.ended(self.unentered(kind, site, python_api, noted=True), None)  # (it launched:
            return result  # recorded as any launch, unannotated)
        try:
            result = call(*call_args)
        except BaseException as exc:
            entered.failed(exc)
            raise
        entered.returned(False, result)
        return result

    # a launch seen entering and returning apart -------------------------------------------------

    def entered(self, kind: Any, site: str | None = None, python_api: bool = True,
                noted: bool = False, cuda: bool = False) -> Any:
        """A launch about to run (``site`` None: found, the first frame outside torch and
        autoannot): its record file's line and rings' records written (``cuda``: its tensors
        are on a GPU, its start timed there where a ring asks), torch's scope entered in a
        capture where torch records. What to end it with (``returned``, ``failed``); None
        where entering it failed (said once: the launch runs, unannotated)."""
        if (ring_only := self.ring_only) is not None and site is not None:  # (the always-on
            ring_only.ring.enter_kind(kind, site)  # case; a failure of the ring's: said by it)
            return ring_only
        entered = Entered(self, kind, site, python_api, noted)
        try:
            if self.marks is not None:
                entered.scope = self.marks(kind[1])
                entered.scope.__enter__()
            if self.files:
                if entered.site is None:
                    entered.site = call_site(3)
                self._to_files(_new_tuple(Record, (kind[0], kind[1], entered.site, kind[2])))
            if self.rings:
                if entered.site is None:
                    entered.site = call_site(3)
                for ring in self.rings:
                    ring.enter_kind(kind, entered.site)
                    entered.rings += (ring,)
                if cuda and self.timing:  # (last: nothing of ours between it and the launch)
                    for ring in self.timing:
                        if (started := ring.gpu_started()) is not None:
                            entered.timed += ((ring, started),)
        except Exception as exc:
            warn_once(kind[0], "entering the annotation context", exc)
            self.ended(entered, exc, quiet=True)
            return None
        return entered

    def unentered(self, kind: Any, site: str | None = None, python_api: bool = True,
                  noted: bool = False) -> Entered:
        """A launch whose entry the route did not see (it entered before the route's observer
        was told), to be ended alone: its ledger and recorders."""
        return Entered(self, kind, site, python_api, noted)

    def ended(self, entered: Entered, exc: BaseException | None, result: Any = None,
              quiet: bool = False) -> None:
        """``entered`` returned ``result`` (``exc`` None), or raised ``exc``: torch's scope left,
        the rings' records ended; once issued, its ledger and the recorders. A failure is said
        once (``quiet``: not, the caller says its own)."""
        kind = entered.kind
        try:
            if entered.timed:  # (first: nothing of ours between the launch and its end)
                for ring, started in entered.timed:
                    ring.gpu_ended(started, exc is not None, result)
            scope, entered.scope = entered.scope, None
            if scope is not None:
                scope.__exit__(*((None, None, None) if exc is None
                                 else (type(exc), exc, exc.__traceback__)))
            if entered.rings:
                for ring in entered.rings:  # (a ring's failure: said by it)
                    ring.returned(exc is not None, result)
            if exc is not None:
                return
            if self.capturing and not entered.noted:
                if entered.site is None:
                    entered.site = call_site(3)
                self.note(kind[0], kind[1], kind[3], entered.site)
            if self.recorders:
                if entered.site is None:
                    entered.site = call_site(3)
                entry = _new_tuple(Record, (kind[0], kind[1], entered.site, kind[2]))
                for recording in (self.recorders if entered.python_api
                                  else self.wanting_below):
                    recording.append(entry)
        except Exception as own:
            if not quiet:
                warn_once(kind[0], "leaving the annotation context", own)

    def _to_files(self, entry: Record) -> None:
        """A launch about to run, to the record files. One that fails is closed, said once;
        the launch, and the other parts of the route, go on."""
        for journal in self.files:
            try:
                journal.enter(entry)
            except Exception as exc:
                from autoannot.base import diagnostics

                self.state.close_journal(journal)
                diagnostics.say_once(f"journal:{id(journal)}", f"autoannot: AUTOANNOT_RECORD: "
                                     f"cannot write {getattr(journal, 'path', journal)} "
                                     f"({type(exc).__name__}: {exc}); no more lines are written "
                                     "to it", stacklevel=5)

    # the native writer, and a graph's replays ---------------------------------------------------

    def for_native(self, kind: Any, site: str | None, writer: Any) -> tuple[int, int] | None:
        """Where one ring with files is all that is open and the native writer (``writer``: the
        native module) writes it — attached now if it can be, the ring opened if need be —: a
        launch of a key the writer does not know yet written through it (``site`` None: its
        caller wrote it already), and its ids in the ring (its kind's, its group's slot), for
        the writer to write that key's launches itself from now on. None where the ring is not
        the writer's: nothing written (the caller hands the launch to ``entered``)."""
        rings = self.rings
        if not self.ring_alone or not rings[0].attach_writer(writer):
            return None
        if site is not None:
            rings[0].enter_kind(kind, site)
        return rings[0].ids_of(kind)

    def in_ledger(self, kind: Any, site: str) -> None:
        """A launch of a capture its observer did not note (the native observer's C wrapper ran
        it): into its graph's ledger (a failure said once)."""
        if self.capturing:
            try:
                self.note(kind[0], kind[1], kind[3], site)
            except Exception as exc:
                warn_once(kind[0], "noting the launch in its graph's ledger", exc)

    def replayed(self, graph: str, entries: list[dict[str, Any]], entered_ns: int,
                 returned_ns: int) -> None:
        """A replay of the captured graph ``graph`` (its ledger's name and entries), called at
        ``entered_ns`` and returned at ``returned_ns`` (``FAILED``: it raised): its launches
        written to the rings that keep replays (a failure said once: the replay stands)."""
        for ring in self.replay_keepers:
            try:
                ring.replayed(graph, entries, entered_ns, returned_ns)
            except Exception as exc:
                warn_once("CUDAGraph.replay", "writing its launches to the ring", exc)


def launcher(kinds: Any, how: int, state: Any) -> Callable[..., Any]:
    """The launch function of one row's wrapt proxy (``observe.wrappers``): the route's fast
    method for that row (``kinds``: its ``RowKinds``; ``how``: ``PYTHON_API``, ``EXCLUDES``).
    Everything a call inlined here would cost a launch ~500 instructions."""
    plan, by_key, learn, label = kinds.plan, kinds.by_key, kinds.learn, kinds.label
    sites = SITES  # (an imported name's method is read as LOAD_ATTR: a bound method a call)
    inside, python_api, excludes = state.inside, bool(how & PYTHON_API), bool(how & EXCLUDES)

    def launch(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        """The original; or the launch by the route: its rule, or its rings, ledger, recorders."""
        __tracebackhide__ = True
        if not state.demand:
            return wrapped(*args, **kwargs)
        ident = get_ident()
        if ident in inside:
            return wrapped(*args, **kwargs)
        why = None
        try:  # (plan.key_of: made at its first call; None is never a key)
            kind = by_key.get(key := plan.key_of(args, kwargs)) or learn(args, kwargs, key)
        except Exception as exc:  # (the call runs outside: its exception carries none of ours)
            kind, why = None, exc
        if kind is None:
            return unannotated(state, label, why, wrapped, args, kwargs)
        route = state.route
        if route.general:
            return route.run_general(kind, _getframe(1), how, wrapped, args, kwargs)
        frame = _getframe(1)  # its site: the caller's line where it is the user's, else found
        code = frame.f_code
        known = sites.get(id(code))
        lines = known[1] if known is not None and known[0] is code else None
        site = lines.get(frame.f_lasti) if lines is not None else None
        if site is None:
            site = site_from(frame)
        if (rings := route.rings_or_none) is not None:  # (a ring's failure: said by it)
            for ring in rings:
                ring.enter_kind(kind, site)
        inside[ident] = 1  # (the call as one launch: ``one_launch``, inlined)
        try:
            if not excludes or (exclusion := state.exclusion) is None:
                result = wrapped(*args, **kwargs)
            elif (claimed := exclusion.call) is not None:  # (the native observer's one call)
                result = claimed(wrapped, args, kwargs)
            else:  # (the Python layer's key, excluded around it)
                set_excluded, dispatch_key = exclusion.set_excluded, exclusion.key
                set_excluded(dispatch_key, True)
                try:
                    result = wrapped(*args, **kwargs)
                finally:
                    set_excluded(dispatch_key, False)
        except BaseException:
            if rings is not None:
                for ring in rings:
                    ring.returned(True)
            raise
        finally:
            del inside[ident]
        if rings is not None:
            for ring in rings:
                ring.returned(False, result)
        if route.capturing:
            route.in_ledger(kind, site)
        if (recorders := route.recorders_or_none if python_api else route.below_or_none):
            entry = _new_tuple(Record, (label, kind[1], site, kind[2]))  # (1, 2: its annotation
            for recording in recorders:  # and CPU-only keys, as Kind names them)
                recording.append(entry)
        return result

    return launch


def unannotated(state: Any, label: str, why: Exception, wrapped: Callable[..., Any],
                args: tuple, kwargs: dict) -> Any:
    """A launch whose kind could not be derived (``why``; ``NotALaunch``: meta or fake tensors,
    tracing: nothing runs, nothing said): run as one launch, unannotated; said once after."""
    __tracebackhide__ = True
    result = one_launch(state, EXCLUDES, wrapped, args, kwargs)
    if why.__class__ is not NotALaunch:
        warn_once(label, "deriving the collective metadata", why)
    return result


def one_launch(state: Any, how: int, wrapped: Callable[..., Any], args: tuple,
               kwargs: dict) -> Any:
    """Run a call whose launch is annotated by its caller: wrapped calls inside it
    (``state.inside``) and the observers below take it for the same launch (``how &
    EXCLUDES``: ``state.exclusion``: the native observer leaves it alone; the Python layer's key
    is excluded around it, so the launch does not also pass through a Python kernel below, ~7 us
    of boxing for nothing)."""
    __tracebackhide__ = True
    inside = state.inside
    ident = get_ident()
    depth = inside.get(ident, 0)
    inside[ident] = depth + 1
    exclusion = state.exclusion if how & EXCLUDES else None
    try:
        if exclusion is None:
            return wrapped(*args, **kwargs)
        if exclusion.call is not None:
            return exclusion.call(wrapped, args, kwargs)
        exclusion.set_excluded(exclusion.key, True)
        try:
            return wrapped(*args, **kwargs)
        finally:
            exclusion.set_excluded(exclusion.key, False)
    finally:
        if depth:
            inside[ident] = depth
        else:
            del inside[ident]

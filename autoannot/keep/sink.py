"""The one place a launch goes once an observer has seen it, and the rule of who gets what.

An observer hands the sink a ``LaunchEvent`` when the launch is entered, before it runs
(``entered``), and once it was issued (``returned``; a launch that raised is not: ``failed``),
or hands it the whole launch to run (``run``). The rule:

* entered: the record file's line (``AUTOANNOT_RECORD``'s journals) and the ring's record
  (``AUTOANNOT_RING``), so a collective that hangs is in the files; in a capture where torch
  records its own annotations (``mark_kernels``), its scope is entered around the launch;
* returned (or failed): the ring's record of it ended; in a capture, its graph's ledger; the
  open ``record()`` recorders, those that asked for the Python API's launches only leaving out
  a launch made below it.

The proxies' wrapper does the same inline, for speed (``observe.wrappers``; a test holds it to
this rule, launch for launch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoannot.base.diagnostics import warn_once
from autoannot.describe.kinds import Kind
from autoannot.describe.sites import call_site
from autoannot.keep.records import Record, new_record


class LaunchEvent:
    """One launch as an observer saw it: its kind, where it was called from (None: found by
    the sink, the first frame outside torch and autoannot), whether it was made through
    torch's Python API, and whether its graph's ledger has it already (the native observer
    notes the launches of a capture itself)."""

    __slots__ = ("call_site", "kind", "noted", "python_api")

    def __init__(self, kind: Kind, call_site: str | None = None, python_api: bool = True,
                 noted: bool = False) -> None:
        self.kind = kind
        self.call_site = call_site
        self.python_api = python_api
        self.noted = noted

    def __repr__(self) -> str:
        return f"LaunchEvent({self.kind.label!r}, {self.call_site!r})"

    def record(self) -> Record:
        kind = self.kind
        if self.call_site is None:
            self.call_site = call_site(3)
        return new_record(kind.label, kind.annotation, self.call_site, kind.cpu_only)


class Sink:
    """Fans each launch out as the module's rule says. ``agent``: the ``Instrumentation`` (its
    ``state``: the recorders and journals open, the captures in progress; ``captures``: the
    ledgers, and torch's ``mark_kernels`` where torch records its own annotations)."""

    __slots__ = ("_agent", "_captures", "_state")

    def __init__(self, agent: Any) -> None:
        self._agent = agent
        self._state = agent.state
        self._captures: Any = None  # (the agent's, once a capture asks)

    def _the_captures(self) -> Any:
        captures = self._captures
        if captures is None:
            captures = self._captures = self._agent.captures
        return captures

    def entered(self, event: LaunchEvent) -> Any:
        """The launch is about to run: the record file's line; in a capture where torch
        records its own annotations, torch's ``mark_kernels`` scope, entered and returned
        (``returned`` or ``failed`` leaves it)."""
        state = self._state
        scope = None
        if state.captures:
            marks = self._the_captures().torch_marks
            if marks is not None:
                scope = marks(event.kind.annotation)
                scope.__enter__()
        if state.journals:
            to_journals(state, event.record())
        return scope

    def returned(self, event: LaunchEvent, scope: Any = None, result: Any = None) -> None:
        """The launch was issued (and returned ``result``): torch's scope left; the ring's
        record ended; its graph's ledger (in a capture), the recorders."""
        if scope is not None:
            scope.__exit__(None, None, None)
        state = self._state
        if state.journals:
            to_finishing(state, False, result)
        if state.captures and not event.noted:
            if event.call_site is None:
                event.call_site = call_site(2)
            kind = event.kind  # (by position, as Kind names them: label, annotation, kernels)
            self._the_captures().note(kind[0], kind[1], kind[3], event.call_site)
        if state.recorders:
            to_recorders(state, event.record(), event.python_api)

    def failed(self, scope: Any, exc: BaseException) -> None:
        """The launch raised (it was not issued: in no ledger, no recorder): torch's scope
        left with the exception."""
        if scope is not None:
            scope.__exit__(type(exc), exc, exc.__traceback__)
        if self._state.journals:
            to_finishing(self._state, True)

    def run(self, event: LaunchEvent, call: Callable[..., Any], *call_args: Any) -> Any:
        """One launch, from entry to return: ``call(*call_args)`` runs it, and returns or
        raises what it does; a failure of the sink's own is said once and never reaches the
        caller (the launch still runs)."""
        __tracebackhide__ = True
        label = event.kind.label
        try:
            scope = self.entered(event)
            entered = True
        except Exception as exc:
            warn_once(label, "entering the annotation context", exc)
            entered = False
        if not entered:  # outside the except block: the caller's exception carries none of ours
            result = call(*call_args)
            if self._state.recorders:  # it launched: recorded as any launch, unannotated
                try:
                    to_recorders(self._state, event.record(), event.python_api)
                except Exception as exc:
                    warn_once(label, "recording", exc)
            return result
        try:
            result = call(*call_args)
        except BaseException as exc:
            try:
                self.failed(scope, exc)
            except Exception as own:
                warn_once(label, "leaving the annotation context", own)
            raise
        try:
            self.returned(event, scope, result)
        except Exception as exc:
            warn_once(label, "leaving the annotation context", exc)
        return result


def to_recorders(state: Any, entry: Record, python_api: bool = True) -> None:
    """Give a launch that returned to the open recorders; one made below torch's Python API
    (``python_api`` false: DDP's reducer, ``pg.*``, compiled code) not to those that asked for
    the Python API's launches only."""
    for recording in state.recorders:
        if python_api or not recording.python_api_only:
            recording.append(entry)


def to_finishing(state: Any, failed: bool, result: Any = None) -> None:
    """Tell the journals that keep each launch's end (the ring) that this thread's launch
    returned ``result``, or raised (``failed``)."""
    for journal in state.journals:
        if getattr(journal, "finishes", False):
            journal.returned(failed, result)


def to_journals(state: Any, entry: Record) -> None:
    """Write a launch about to run to the open journals (``AUTOANNOT_RECORD``). A journal that
    fails is closed, said once; the launch, and the in-memory recorders, go on."""
    for journal in state.journals:
        try:
            journal.enter(entry)
        except Exception as exc:
            from autoannot.base import diagnostics

            state.close_journal(journal)
            diagnostics.say_once(f"journal:{id(journal)}", f"autoannot: AUTOANNOT_RECORD: "
                                 f"cannot write {getattr(journal, 'path', journal)} "
                                 f"({type(exc).__name__}: {exc}); no more lines are written "
                                 "to it", stacklevel=5)

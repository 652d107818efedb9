"""Reading and writing traces: Kineto's JSON (streamed when it has Kineto's layout), gzip, and
atomic writes (a temporary file renamed into place: never a half-written output)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from autoannot.traces.progress import Progress


class TraceError(Exception):
    """A trace or ledger that cannot be used; the message names the file and the problem."""


#: Folders this process made temporary files in (``remove_temporary_files``).
_TEMPORARY_FOLDERS: set[str] = set()


def temporary_file(folder: str) -> tuple[int, str]:
    """A new file beside the output, opened for writing with the mode ``open()`` would give
    (0666 less the umask, applied by the kernel: the process's umask is never changed). Its
    name holds this process's id, and its folder is noted before it is made: a Ctrl-C between
    its making and its caller's knowing of it leaves it to ``remove_temporary_files``."""
    _TEMPORARY_FOLDERS.add(folder)
    while True:
        name = os.path.join(folder, f".autoannot-{os.getpid()}-{secrets.token_hex(6)}.tmp")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), name
        except FileExistsError:
            continue


def _named(exc: OSError, path: str | os.PathLike[str]) -> OSError:
    """The error of writing a temporary file, naming the output instead."""
    return OSError(exc.errno, exc.strerror, os.fspath(path))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write to a temporary file in the same folder, then rename: never a half-written file.
    An error names ``path``, not the temporary file."""
    _atomic(path, "wb", lambda out: out.write(data))


def _atomic(path: str | os.PathLike[str], mode: str, write: Callable[[Any], Any]) -> None:
    """``write(file)`` into a temporary file beside ``path`` opened with ``mode``, renamed to
    ``path`` once written; removed on any failure, whose error names ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = temporary_file(folder)
    except OSError as exc:
        raise _named(exc, path) from None
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as out:
            write(out)
        os.replace(tmp, path)
    except OSError as exc:
        remove_quietly(tmp)
        raise _named(exc, path) from None
    except BaseException:
        remove_quietly(tmp)
        raise


def remove_temporary_files() -> None:
    """Remove what is left of this process's temporary files (an interrupted command: one
    made as the Ctrl-C came, before the code that would remove it knew its name)."""
    import glob

    for folder in list(_TEMPORARY_FOLDERS):
        for left in glob.glob(os.path.join(glob.escape(folder), f".autoannot-{os.getpid()}-*.tmp")):
            remove_quietly(left)


def remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_lines(path: str | os.PathLike[str], lines: Iterator[str]) -> None:
    """``atomic_write_text`` of text made a piece at a time (never all held at once)."""
    _atomic(path, "w", lambda out: out.writelines(lines))


#: The top-level key of every trace autoannot writes: what it was annotated from. Tools read it
#: to never take an output for an input (``annotate``) or for a second trace of a rank.
MARKER = "autoannotAnnotated"


def head_text(path: Path, size: int = 1 << 16) -> str:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            return f.read(size)
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(size)


def annotated_from(path: Path) -> dict[str, Any] | None:
    """The marker of a trace autoannot wrote (``{"from": ..., "ledger": ...}``), else None."""
    try:
        head = head_text(path)
    except (OSError, EOFError):
        return None
    at = head.find(f'"{MARKER}": ')
    if at < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(head, at + len(MARKER) + 4)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def is_annotated_output(path: Path) -> bool:
    return annotated_from(path) is not None


_EVENTS_KEY = '"traceEvents": ['
_SEPARATOR = "\n  },\n  {\n"  # Kineto writes one event per "  {...}" block


def read_text(path: Path) -> str:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return f.read()
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None


def write_text(path: Path, text: str) -> None:
    """Write atomically (temporary file, then rename); gzip for ``.gz`` names."""
    data = text.encode("utf-8")
    if path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=3, mtime=0)
    atomic_write_bytes(path, data)


class Trace:
    """A trace read in two streaming passes when it has Kineto's layout (one event per
    ``"  {...}"`` block): the first parses only the events the caller wants, the second copies
    every other event's text unchanged. Other layouts are parsed whole."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: dict[int, Event] = {}  # the scanned events, by index
        self.added: list[dict[str, Any]] = []  # events to append
        self.document: dict[str, Any] | None = None
        self.head = self._read_head()
        if self.head is None:  # not Kineto's layout: parse it whole
            self.document = self._parse_whole()

    def _open(self) -> Any:
        if self.path.name.endswith(".gz"):
            return gzip.open(self.path, "rt", encoding="utf-8")
        return open(self.path, encoding="utf-8")

    def _read_head(self) -> str | None:
        """The text before the first event, if the trace has Kineto's layout."""
        if not self.path.is_file():
            raise TraceError(f"{self.path}: no such file")
        try:
            with self._open() as f:
                start = f.read(1 << 16)
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise TraceError(f"{self.path}: cannot read: {exc}") from None
        key = start.find(_EVENTS_KEY)
        opening = key + len(_EVENTS_KEY)
        if key < 0 or not start.startswith('\n  {\n    "', opening):  # (json.dump's indent=1
            return None                                               # is not Kineto's)
        return start[: opening + len("\n  {\n")]

    def _parse_whole(self) -> dict[str, Any]:
        try:
            with self._open() as f:
                doc = json.load(f)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{self.path}: not valid JSON ({exc.msg} at line {exc.lineno}); "
                             "truncated?") from None
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise TraceError(f"{self.path}: cannot read: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            raise TraceError(f"{self.path}: no traceEvents list: not a Kineto/Chrome trace")
        return doc

    def _blocks(self) -> Iterator[list[str]]:
        """The events' texts (without their braces), a few MiB at a time; then ``self.tail``
        is set."""
        assert self.head is not None
        try:
            size = self.path.stat().st_size
        except OSError:
            size = 1
        bar = Progress(size, self.path.name, bar=True)
        try:
            with self._open() as f:
                f.read(len(self.head))
                pending, eof = "", False
                while not eof:
                    block = f.read(_BLOCK)
                    eof = not block
                    bar.step(amount=len(block))
                    parts = (pending + block).split(_SEPARATOR)
                    pending = parts.pop()
                    if parts:
                        yield parts
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise TraceError(f"{self.path}: cannot read: {exc}") from None
        finally:
            bar.close()
        end = pending.rfind(_CLOSING)
        if end < 0 or not pending.rstrip().endswith("}"):
            raise TraceError(f"{self.path}: the event list is not closed: truncated trace?")
        self.tail = pending[end:]
        yield [pending[:end]]

    def _chunks(self) -> Iterator[str]:
        for block in self._blocks():
            yield from block

    def scan(self, wanted: Callable[[str], bool]) -> Iterator[int]:
        """Parse and yield the events ``wanted`` accepts (given each event's raw text); every
        event when the trace was parsed whole."""
        if self.document is not None:
            for index, event in enumerate(self.document["traceEvents"]):
                if isinstance(event, dict):
                    self.events[index] = Event.of(event)
                    yield index
            return
        for index, chunk in enumerate(self._chunks()):
            if wanted(chunk):
                try:
                    self.events[index] = Event.parse(chunk)
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{self.path}: event {index} is not valid JSON "
                                     f"({exc.msg})") from None
                yield index

    def event(self, index: int) -> Event:
        return self.events[index]

    def metadata(self) -> dict[str, Any]:
        """The document's top-level keys other than the events (``distributedInfo``, ...)."""
        if self.document is not None:
            return {k: v for k, v in self.document.items() if k != "traceEvents"}
        try:
            return json.loads(self.head[: self.head.rfind(_EVENTS_KEY)].rstrip().rstrip(",")
                              + "\n}")
        except json.JSONDecodeError:
            return {}

    def all_events(self, patches: Any) -> list[dict[str, Any]]:
        """Every event, parsed and patched (for formats that need them all)."""
        if self.document is not None:
            events = self.document["traceEvents"]
        else:
            events = [json.loads("{" + chunk + "}") for chunk in self._chunks()]
        return [patches.apply_to_event(i, e) if i in patches else e
                for i, e in enumerate(events)] + self.added

    def write(self, output: Path, patches: Any, marker: dict[str, Any]) -> None:
        """Write the patched trace and the added events, atomically, with ``marker`` as the
        first top-level key (``MARKER``); streaming when the trace has Kineto's layout
        (unchanged events are copied as text)."""
        if self.document is not None:
            events = self.document["traceEvents"]
            for index in list(patches.kernels) + list(patches.flows):
                patches.apply_to_event(index, events[index])
            events.extend(self.added)
            document = {MARKER: marker,
                        **{k: v for k, v in self.document.items() if k != MARKER}}
            write_text(output, json.dumps(document))
            return
        with _AtomicOutput(output) as out:
            out.write(_with_marker(self.head, marker))
            index = 0
            for block in self._blocks():
                if index:
                    out.write(_SEPARATOR)
                for i in patches.indices_between(index, index + len(block)):
                    block[i - index] = patches.apply_to_text(i, block[i - index])
                out.write(_SEPARATOR.join(block))
                index += len(block)
            for event in self.added:
                out.write(_SEPARATOR)
                out.write(dump_event(event))
            out.write(self.tail)


def _with_marker(head: str, marker: dict[str, Any]) -> str:
    """Kineto's text before the first event, with the marker as the first key (replacing an
    earlier one: a trace annotated in-job, then again)."""
    text = f'\n  "{MARKER}": {json.dumps(marker)},'
    at = head.find(f'"{MARKER}": ')
    if at >= 0:
        end = head.find("\n", at)
        start = head.rfind("\n", 0, at)
        head = head[:start] + head[end:]
    opening = head.index("{") + 1
    return head[:opening] + text + head[opening:]


_BLOCK = 1 << 20
# Kineto's text of an "X" event: "ph", "cat", "name", "pid", "tid", then "ts", "dur".
_HEAD = re.compile(r'^\s*"ph": "X", "cat": "(kernel|cuda_runtime|user_annotation)", '
                   r'"name": "([^"\\]*)", "pid": ([^,]+), "tid": ([^,]+),\s*'
                   r'"ts": ([-0-9.e+]+), "dur": ([-0-9.e+]+)')
_CORRELATION = re.compile(r'"correlation": (-?\d+)')
_NODE = re.compile(r'"graph node id": (\d+)')


def _number(text: str) -> Any:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return json.loads(text)


class Event(NamedTuple):
    """What matching reads of an event (the event's text is what gets written)."""

    cat: Any
    ph: Any
    name: str
    pid: Any
    tid: Any
    ts: float
    dur: float
    correlation: Any
    node: Any  # "graph node id"
    label: Any  # args "name" (thread names)
    collective: bool  # carries "Collective name" (an eager NCCL kernel, or annotated)
    #: its args, kept only where it carries "Collective name", and for gloo's ranges
    args: dict[str, Any] | None = None

    @staticmethod
    def parse(chunk: str) -> Event:
        """From Kineto's text of a kernel or runtime event: a regex where it fits, else JSON."""
        keep_args = '"Collective name"' in chunk or '"name": "gloo:' in chunk
        head = _HEAD.match(chunk) if not keep_args else None
        if head is not None:
            cat, name, pid, tid, ts, dur = head.groups()
            correlation = _CORRELATION.search(chunk)
            node = _NODE.search(chunk)
            pid = int(pid) if pid.isdigit() else _number(pid)
            tid = int(tid) if tid.isdigit() else _number(tid)
            return Event(cat, "X", sys.intern(name), pid, tid, float(ts),
                         float(dur), int(correlation.group(1)) if correlation else None,
                         int(node.group(1)) if node else None, None, False)
        return Event.of(json.loads("{" + chunk + "}"))

    @staticmethod
    def of(event: dict[str, Any]) -> Event:
        args = event.get("args") or {}
        return Event(event.get("cat"), event.get("ph"), sys.intern(str(event.get("name", ""))),
                     event.get("pid"), event.get("tid"), float(event.get("ts", 0)),
                     float(event.get("dur", 0)), args.get("correlation"),
                     args.get("graph node id"), args.get("name"),
                     "Collective name" in args,
                     args if "Collective name" in args or str(event.get("name", "")).startswith(
                         "gloo:") else None)
_CLOSING = "\n  }\n  ]"


class _AtomicOutput:
    """A text file written to a temporary name and renamed into place on success."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> Any:
        try:
            fd, self.tmp = temporary_file(str(self.path.parent))
        except OSError as exc:
            raise _named(exc, self.path) from None
        self.raw = os.fdopen(fd, "wb")
        if self.path.name.endswith(".gz"):
            self.stream = gzip.open(self.raw, "wt", encoding="utf-8", compresslevel=3)
        else:
            self.stream = open(fd, "w", encoding="utf-8", closefd=False)
        return self.stream

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.stream.close()
            self.raw.close()
            if exc_type is None:
                os.replace(self.tmp, self.path)
        except OSError as error:
            raise _named(error, self.path) from None
        finally:
            remove_quietly(self.tmp)
        if isinstance(exc, OSError) and exc.filename == self.tmp:
            raise _named(exc, self.path) from None


def dump_event(event: dict[str, Any]) -> str:
    text = json.dumps(event, separators=(", ", ": "))
    return "    " + text[1:-1]



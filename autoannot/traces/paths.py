"""Which files a trace command reads and writes.

Inputs: trace files, or folders (what ``tensorboard_trace_handler`` writes), whose traces are
taken (``*.json``, ``*.json.gz``; not ledgers, not autoannot's own outputs). Outputs: one per
input, never an input and never two the same; several inputs and an output folder keep their
layout relative to the inputs' common folder (``n0/trace.json n1/trace.json -o out/`` writes
``out/n0/trace.json`` and ``out/n1/trace.json``).
"""

from __future__ import annotations

import os
from pathlib import Path

from autoannot.traces.files import TraceError, annotated_from, head_text, is_annotated_output

TRACE_ENDINGS = (".json", ".json.gz")
LEDGER_ENDINGS = (".autoannot", ".autoannot.json")
#: Output formats by file ending (``--format`` takes the same words, without the dot).
FORMATS = {"json": ".json", "json.gz": ".json.gz", "pftrace": ".pftrace"}
#: Where ``annotate`` writes by default: this folder next to each trace (no folder loader
#: then takes an output for a rank's trace, and a glob of the traces never matches one).
DEFAULT_FOLDER = "annotated"


def is_trace_name(path: Path) -> bool:
    name = path.name
    return name.endswith(TRACE_ENDINGS) and not name.endswith(LEDGER_ENDINGS)


def looks_like_trace(path: Path) -> bool:
    """Whether a file's head has a trace's event list (a framework's ``metrics.json`` has
    none)."""
    try:
        return '"traceEvents"' in head_text(path)
    except (OSError, EOFError, UnicodeDecodeError):
        return False


def _in_folder(folder: Path, skip_outputs: bool, skipped: list[str] | None) -> list[Path]:
    """The traces of a folder: not the files autoannot's other commands wrote there (rows,
    pictures), not files that are no trace (each named in ``skipped``); annotated outputs
    left out where ``skip_outputs``, else taken instead of the raw traces they came from."""
    from autoannot.traces import outputs

    own = outputs.listed_outputs(folder)
    inside = []
    for p in sorted(p for p in folder.iterdir() if p.is_file() and is_trace_name(p)):
        by = own.get(p.name)
        if by is not None and by != "annotate":
            reason = f"written by autoannot {by}"
        elif not looks_like_trace(p):
            reason = "not a trace (no traceEvents)"
        else:
            inside.append(p)
            continue
        if skipped is not None:
            skipped.append(f"skipped {p}: {reason}")
    if skip_outputs:
        return [p for p in inside if not is_annotated_output(p)]
    sources = set()
    for p in inside:
        marker = annotated_from(p)
        if marker is not None and marker.get("from"):
            sources.add(Path(str(marker["from"])).name)
    return [p for p in inside if is_annotated_output(p) or p.name not in sources]


def expand(arguments: list[str], skip_outputs: bool = True,
           skipped: list[str] | None = None) -> list[Path]:
    """The trace files the arguments name: files as given, folders as the traces in them
    (sorted; ledgers, other commands' outputs and files that are no trace left out — named in
    ``skipped`` —, and autoannot's annotated outputs where ``skip_outputs``, else preferred to
    the raw traces they came from). Raises TraceError for a path that does not exist, a folder
    with no trace, or a trace given twice."""
    found: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            inside = _in_folder(path, skip_outputs, skipped)
            if not inside:
                raise TraceError(f"{path}: a folder with no trace in it (*.json, *.json.gz)")
            found.extend(inside)
        elif path.exists():
            found.append(path)
        else:
            raise TraceError(f"{path}: no such file or folder")
    seen: dict[str, Path] = {}
    for path in found:
        key = os.path.realpath(path)
        if key in seen:
            raise TraceError(f"{path}: given twice (also as {seen[key]})")
        seen[key] = path
    return found


def _stem(name: str) -> str:
    for ending in (".json.gz", ".json", ".pftrace"):
        if name.endswith(ending):
            return name[: -len(ending)]
    return name


def with_format(path: Path, ending: str | None) -> Path:
    return path if ending is None else path.with_name(_stem(path.name) + ending)


def format_of(path: Path) -> str | None:
    """The output ending of a file name (``.json``, ``.json.gz``, ``.pftrace``), or None."""
    for ending in (".json.gz", ".json", ".pftrace"):
        if path.name.endswith(ending):
            return ending
    return None


def plan_outputs(inputs: list[Path], output: str | None, fmt: str | None) -> list[Path]:
    """One output per input (see the module's docstring). ``output``: ``-o``: a folder where it
    is one, ends in ``/`` or has no extension (any number of inputs), else a file (one input,
    named ``.json``, ``.json.gz`` or ``.pftrace``); ``fmt``: ``--format``.
    Raises TraceError for a plan that would lose or overwrite data."""
    ending = FORMATS[fmt] if fmt else None
    if output is None:
        outputs = [with_format(p.parent / DEFAULT_FOLDER / p.name, ending) for p in inputs]
    else:
        out = Path(output)
        as_folder = out.is_dir() or output.endswith(("/", os.sep)) or not out.suffix
        if not as_folder and len(inputs) > 1:
            raise TraceError(f"-o {output}: names a file, and {len(inputs)} traces need one "
                             f"output each: give a folder (-o {out.parent / _stem(out.name)}/)")
        if as_folder:
            base = Path(os.path.commonpath([os.path.abspath(p.parent) for p in inputs]))
            outputs = [with_format(out / os.path.relpath(os.path.abspath(p), base), ending)
                       for p in inputs]
        else:
            if ending is not None and format_of(out) not in (None, ending):
                raise TraceError(f"-o {output} and --format {fmt} disagree: give one")
            outputs = [out]
    for out in outputs:
        if format_of(out) is None:
            raise TraceError(f"{out}: unknown output format (name it .json, .json.gz or "
                             ".pftrace, or give --format)")
    check_outputs(inputs, outputs)
    return outputs


def check_outputs(inputs: list[Path], outputs: list[Path]) -> None:
    """Refuse outputs that are an input, or the output of another input."""
    if not outputs:
        return
    # (an input an output can be: its name, or a link; thousands of inputs: no realpath each)
    names = {Path(os.path.realpath(out)).name for out in outputs} | {out.name for out in outputs}
    read = {os.path.realpath(p): p for p in inputs
            if Path(p).name in names or os.path.islink(p)}
    written: dict[str, Path] = {}
    for out in outputs:
        key = os.path.realpath(out)
        if key in read:
            raise TraceError(f"{out}: is an input of this command: refusing to write over it "
                             "(choose another -o)")
        if key in written:
            raise TraceError(f"{out}: two inputs would both be written there "
                             f"({written[key]} too): give -o a folder")
        written[key] = out


def make_parent(path: Path) -> list[Path]:
    """Create an output's folder (and its parents) where missing; the folders made."""
    made = []
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TraceError(f"{path}: cannot create its folder {path.parent}: "
                         f"{exc.strerror}") from None
    return made

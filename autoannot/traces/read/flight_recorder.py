"""torch's Flight Recorder dumps as a rank's launches: what a job that ran without autoannot
leaves when it hangs (``TORCH_FR_BUFFER_SIZE``; dumped by NCCL's watchdog on a timeout into
``TORCH_FR_DUMP_TEMP_FILE``'s files, or by ``torch._C._distributed_c10d._dump_fr_trace()`` /
``_dump_fr_trace_json()``).

A dump is a pickle (or JSON) of ``{"version", "pg_config", "pg_status", "entries", ...}``; each
entry one collective a rank launched: its group (``process_group``: name, description), its
place in the group's sequence (``collective_seq_id``, from 1; ``p2p_seq_id`` for
sends and receives), ``profiling_name`` ("nccl:all_reduce"), input sizes and dtypes, the
Python stack (``frames``), its state and times where torch recorded them
(``time_created_ns``; ``time_discovered_started_ns``/``completed_ns`` where the watchdog saw
it: NCCL's; gloo's entries stay "scheduled"). The rank is in the file's name (torch writes
``PREFIX<rank>``). Read with an unpickler that makes nothing but plain values (a pickle can
run code: these files come from a job, not from us).
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

from autoannot.traces import files
from autoannot.traces.table.launch import Launch

#: Bytes of each element of the dtypes torch names in ``input_dtypes``.
ITEM_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4,
              "Short": 2, "Char": 1, "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1,
              "Float8_e5m2": 1, "ComplexFloat": 8, "ComplexDouble": 16}

#: Flight Recorder's collective names onto those torch's profiler records ("Collective name").
NAMES = {"all_reduce": "allreduce", "allreduce": "allreduce", "broadcast": "broadcast",
         "all_gather": "allgather", "allgather": "allgather",
         "all_gather_into_tensor": "_allgather_base", "_allgather_base": "_allgather_base",
         "_all_gather_base": "_allgather_base",
         "allgather_into_tensor_coalesced": "allgather_into_tensor_coalesced",
         "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "_reduce_scatter_base",
         "_reduce_scatter_base": "_reduce_scatter_base", "reduce": "reduce",
         "all_to_all": "alltoall", "alltoall": "alltoall", "alltoall_base": "alltoall_base",
         "all_to_all_single": "alltoall_base", "gather": "gather", "scatter": "scatter",
         "barrier": "barrier", "send": "send", "recv": "recv"}

_RANK = re.compile(r"(\d+)(?:\.json)?$")


class _PlainValues(pickle.Unpickler):
    """Unpickles plain values only (dicts, lists, tuples, strings, numbers, None)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a Flight Recorder dump holds plain values, not "
                                     f"{module}.{name}")


def load(path: Path) -> dict[str, Any] | None:
    """A dump's contents, or None where ``path`` is no Flight Recorder dump."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(2)
            handle.seek(0)
            if head[:1] == b"\x80":  # (a pickle, protocol 2 or later)
                found = _PlainValues(handle).load()
            elif head[:1] == b"{" and path.name.endswith(".json"):
                start = handle.read(1 << 12)  # (a trace is a JSON object too: its head says)
                if b'"traceEvents"' in start or not (b'"entries"' in start
                                                    or b'"comm_lib_version"' in start
                                                    or b'"pg_config"' in start):
                    return None
                handle.seek(0)
                found = json.load(handle)
            else:
                return None
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, UnicodeDecodeError,
            AttributeError, IndexError, TypeError):
        return None
    if not isinstance(found, dict) or "entries" not in found or "version" not in found:
        return None
    return found


def is_dump(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a Flight Recorder dump (named as torch names them: ending in the
    rank)."""
    path = Path(path)
    return bool(_RANK.search(path.name)) and path.is_file() and load(path) is not None


def rank_of(path: Path, dump: dict[str, Any]) -> int:
    if isinstance(dump.get("rank"), int):
        return int(dump["rank"])
    found = _RANK.search(path.name)
    if found is None:
        raise files.TraceError(f"{path}: a Flight Recorder dump whose name ends in no rank "
                               "(torch names them PREFIX<rank>)")
    return int(found.group(1))


def read(paths: list[Path]) -> list[Any]:
    """Each dump's rows (``rows.Rows``, in memory): its collectives, the groups' members
    from ``pg_config`` where it names them, else every rank whose dump has launches of the
    group (gloo's dumps name none). Said in each one's ``extra``: its version, and whether
    its states never completed."""
    from autoannot.traces.table import rows

    read = []
    for path in paths:
        dump = load(path)
        if dump is None:
            raise files.TraceError(f"{path}: not a Flight Recorder dump")
        read.append((path, dump, rank_of(path, dump)))
    versions = {str(dump.get("version")) for _, dump, _ in read}
    if len(versions) > 1:  # (torch's own analyzer refuses them too)
        raise files.TraceError("these Flight Recorder dumps are of different versions ("
                               + ", ".join(sorted(versions)) + "): give one job's dumps")
    seen: dict[str, set[int]] = {}
    named: dict[str, tuple[int, ...]] = {}
    for _, dump, rank in read:
        named.update(_members(dump.get("pg_config") or {}))
        for entry in dump.get("entries") or []:
            if isinstance(entry, dict) and not entry.get("is_p2p"):
                group = entry.get("process_group")
                if isinstance(group, (list, tuple)) and group:
                    seen.setdefault(str(group[0]), set()).add(rank)
    members = {g: named.get(g, tuple(sorted(ranks))) for g, ranks in seen.items()}
    made = []
    for path, dump, rank in read:
        found = launches(path, dump, rank, members)
        states = {str(e.get("state")) for e in dump.get("entries") or [] if isinstance(e, dict)}
        made.append(rows.from_launches(
            found, rank, clock="wall", source=path.name,
            extra={"flight_recorder": str(dump.get("version")),
                   "never_completed": "completed" not in states}))
    return made


def launches(path: Path, dump: dict[str, Any], rank: int,
             members: dict[str, tuple[int, ...]]) -> list[Launch]:
    """A dump's collectives as launches (sends and receives left out: their sequence is the
    pair's, not the group's)."""
    found = []
    for entry in dump.get("entries") or []:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        try:
            group, desc = (str(v) for v in entry["process_group"])
            seq = int(entry["collective_seq_id"]) - 1  # (from 1 in torch's; from 0 here)
            name = str(entry["profiling_name"]).split(":", 1)[-1]
        except (KeyError, TypeError, ValueError):
            raise files.TraceError(f"{path}: an entry with no group or sequence number "
                                   f"(Flight Recorder version {dump.get('version')})") from None
        created = entry.get("time_created_ns")
        ended = entry.get("time_discovered_completed_ns")
        dtypes = [str(d) for d in entry.get("input_dtypes") or []]
        ranks = members.get(group)
        found.append(Launch(
            rank, group, seq, NAMES.get(name, name), _bytes(entry.get("input_sizes"), dtypes),
            len(ranks) if ranks else 0,
            created / 1e3 if isinstance(created, int) else float("nan"),
            ended / 1e3 if isinstance(ended, int) and entry.get("state") == "completed"
            else None,
            call_site=_call_site(entry.get("frames") or []), group_desc="" if desc ==
            "undefined" else desc, group_ranks=ranks, dtype=dtypes[0] if dtypes else "",
            wall_us=created / 1e3 if isinstance(created, int) else None))
    return found


def _members(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Each group's member ranks where ``pg_config`` names them (gloo's dumps: empty)."""
    found = {}
    for name, facts in config.items():
        ranks = facts.get("ranks") if isinstance(facts, dict) else None
        if isinstance(ranks, str):
            try:
                ranks = json.loads(ranks)
            except ValueError:
                ranks = None
        if isinstance(ranks, list) and ranks and all(isinstance(r, int) for r in ranks):
            found[str(name)] = tuple(ranks)
    return found


def _bytes(sizes: Any, dtypes: list[str]) -> int:
    """The input's bytes: each tensor's elements times its dtype's size."""
    total = 0
    for shape, dtype in zip(sizes or [], dtypes or [], strict=False):
        elements = 1
        for n in shape:
            elements *= int(n)
        total += elements * ITEM_BYTES.get(dtype, 1)
    return total


def _not_the_users() -> tuple[str, ...]:
    """Where code that is not the user's lies: autoannot, installed packages (torch's among
    them), Python's own library."""
    import sysconfig

    places = {os.path.dirname(os.path.dirname(os.path.abspath(files.__file__)))}
    places |= {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    return tuple(os.path.join(p, "") for p in places)


def _call_site(frames: list[dict[str, Any]]) -> str | None:
    """The first frame of the user's code (the stack is innermost first): outside
    autoannot, installed packages and Python's own library (on another machine's dumps:
    outside any ``site-packages``)."""
    skip = _not_the_users()
    for frame in frames:
        name = str(frame.get("filename", ""))
        if (not name or name.startswith("<") or name.startswith(skip)
                or "/site-packages/" in name or "/dist-packages/" in name):
            continue
        return f"{name}:{frame.get('line')}"
    return None

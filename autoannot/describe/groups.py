"""Process groups: resolve what a call names as its group; cache what the annotation needs."""

from __future__ import annotations

import dataclasses
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autoannot.base import locks
from autoannot.describe import vocabulary as V


@dataclass(frozen=True, slots=True, eq=False)  # compared and hashed by identity (cache keys)
class GroupFacts:
    """What the profiler records about a process group, computed once per group.

    Read from the group object itself; where it cannot say (a backend built directly and never
    registered, a group implemented in Python), the field is left out, never invented."""

    name: str  # "" when the group has none
    desc: str
    ranks: tuple[int, ...] | None  # global ranks, in group-rank order; None: not registered
    #: The global ranks as the process group records them (ProcessGroupNCCL rebuilds them
    #: from start and stride: none for a group of one rank or one not strided). A send's or
    #: recv's peer ("Dst Rank", "Src Rank") is looked up there.
    recorded_ranks: tuple[int, ...]
    ranks_text: str | None  # "Process Group Ranks": ``recorded_ranks``
    size: int
    rank: int  # this process's rank in the group
    global_rank_start: int
    global_rank_stride: int
    lane: int  # "stream" of the annotation: one lane per group, >= 60
    group_keys: dict[str, Any]  # the group's part of the kernel args, in the profiler's order
    global_rank_keys: dict[str, int]  # "Global rank start/stride", where the profiler has them


def _group_keys(name: str, desc: str, ranks_text: str | None) -> dict[str, Any]:
    keys: dict[str, Any] = {}
    if name:  # the profiler omits empty names
        keys[V.PG_NAME] = name
    if desc:
        keys[V.PG_DESC] = desc
    if ranks_text is not None:
        keys[V.PG_RANKS] = ranks_text
    return keys


def _global_rank_keys(start: int | None, stride: int) -> dict[str, int]:
    keys: dict[str, int] = {}
    if start is None:  # the group's global ranks are not known
        return keys
    if start >= 0:
        keys[V.GLOBAL_RANK_START] = start
    if stride > 0:  # -1: not strided, 0: one rank
        keys[V.GLOBAL_RANK_STRIDE] = stride
    return keys


_lock = locks.renewed(sys.modules[__name__], "_lock")
# id(pg) -> (weak reference to pg, facts). Weak: holding a group would keep its backend alive
# after destroy_process_group(), its threads running into interpreter exit (where gloo's can
# abort the process); the entry goes when the group does.
_facts: dict[int, tuple[weakref.ref, GroupFacts]] = {}
_own_lanes: dict[str, int] = {}


def lane_for(group_name: str) -> int:
    """The lane of a group: torch's ``get_stream_for_pg`` where torch has it, else our own."""
    get_stream_for_pg = _torch_get_stream_for_pg()
    if get_stream_for_pg is not None:
        return int(get_stream_for_pg(group_name))
    with _lock:
        lane = _own_lanes.get(group_name)
        if lane is None:
            lane = _own_lanes[group_name] = V.FIRST_LANE + len(_own_lanes)
        return lane


def _torch_get_stream_for_pg() -> Any:
    from autoannot.base import features

    api = features.graph_annotations()
    return api.get_stream_for_pg if api is not None else None


def _stride_of(ranks: tuple[int, ...] | None, is_default: bool) -> tuple[int | None, int]:
    """Global rank start and stride as ProcessGroupNCCL computes them (-1: not strided;
    None: the global ranks are not known)."""
    if is_default:
        return 0, 1
    if ranks is None:
        return None, -1
    if not ranks:
        return 0, 1
    if len(ranks) == 1:
        return ranks[0], 0
    stride = ranks[1] - ranks[0]
    strided = all(r == ranks[0] + i * stride for i, r in enumerate(ranks))
    return ranks[0], stride if strided else -1


def _recorded_ranks(start: int | None, stride: int, size: int) -> tuple[int, ...]:
    """The group's global ranks as its ``record_param_comms`` holds them: rebuilt from start
    and stride, where the stride is positive (ParamCommsDebugInfo's constructor)."""
    if start is None or stride <= 0:
        return ()
    return tuple(start + i * stride for i in range(size))


_recorded: dict[tuple, GroupFacts] = {}


def facts_of_record(name: str, desc: str, ranks: list[int], size: int, start: int,
                    stride: int) -> GroupFacts:
    """The facts of the group a process group's own record of a launch names (the
    ``ParamCommsDebugInfo`` the native observer reads): as the profiler writes them."""
    key = (name, desc, tuple(ranks), size, start, stride)
    facts = _recorded.get(key)
    if facts is None:
        recorded = tuple(ranks)
        facts = GroupFacts(
            name=name, desc=desc, ranks=recorded or None, recorded_ranks=recorded,
            ranks_text=V.format_list(recorded), size=size, rank=-1,
            global_rank_start=start, global_rank_stride=stride, lane=lane_for(name),
            group_keys=_group_keys(name, desc, V.format_list(recorded)),
            global_rank_keys=_global_rank_keys(start, stride))
        if len(_recorded) >= 4096:
            _recorded.clear()
        _recorded[key] = facts
    return facts


_unranked: dict[int, tuple[GroupFacts, GroupFacts]] = {}


def unranked(facts: GroupFacts) -> GroupFacts:
    """The group as a record without its global ranks reads (the symm_mem ops record start and
    stride -1: "Process Group Ranks" is "[]", no "Global rank start/stride")."""
    entry = _unranked.get(id(facts))
    if entry is not None and entry[0] is facts:
        return entry[1]
    found = dataclasses.replace(
        facts, recorded_ranks=(), ranks_text=V.EMPTY_LIST,
        group_keys=_group_keys(facts.name, facts.desc, V.EMPTY_LIST), global_rank_keys={})
    if len(_unranked) >= 4096:
        _unranked.clear()
    _unranked[id(facts)] = (facts, found)
    return found


def facts_of(pg: Any) -> GroupFacts:
    """The cached facts of a ProcessGroup (built on first use)."""
    entry = _facts.get(id(pg))
    if entry is not None and entry[0]() is pg:
        return entry[1]
    from torch.distributed import distributed_c10d as c10d

    ranks = _registered_ranks(c10d, pg)
    is_default = pg is c10d.GroupMember.WORLD
    start, stride = _stride_of(ranks, is_default)
    name, desc = _text(pg, "group_name"), _text(pg, "group_desc")
    size = pg.size()
    recorded = _recorded_ranks(start, stride, size) if ranks is not None else ()
    ranks_text = V.format_list(recorded) if ranks is not None else None
    facts = GroupFacts(
        name=name,
        desc=desc,
        ranks=ranks,
        recorded_ranks=recorded,
        ranks_text=ranks_text,
        size=size,
        rank=pg.rank(),
        global_rank_start=start,
        global_rank_stride=stride,
        lane=lane_for(name),
        group_keys=_group_keys(name, desc, ranks_text),
        global_rank_keys=_global_rank_keys(start, stride),
    )
    key = id(pg)

    def forget(ref: weakref.ref) -> None:  # the group is gone: its id may be reused
        with _lock:
            if _facts.get(key, (None,))[0] is ref:
                del _facts[key]
        for cache in list(_id_keyed):
            cache.clear()
        for listener in list(_gone_listeners):
            try:
                listener()
            except Exception as exc:  # (in a weakref callback: said, never raised)
                from autoannot.base import diagnostics

                diagnostics.warn_once("process group", "forgetting a group that is gone", exc)

    with _lock:
        _facts[key] = (weakref.ref(pg, forget), facts)
    return facts


class IdKeyedCache(dict):
    """A dict whose keys name groups by ``id()`` (launch keys): emptied when any group whose
    facts were taken is gone, before its id can be reused."""

    __slots__ = ("__weakref__",)
    __hash__ = object.__hash__  # one cache is one cache, whatever it holds (a WeakSet member)
    __eq__ = object.__eq__  # type: ignore[assignment]


_id_keyed: weakref.WeakSet[IdKeyedCache] = weakref.WeakSet()
_gone_listeners: list[Callable[[], None]] = []


def on_group_gone(listener: Callable[[], None]) -> None:
    """Call ``listener()`` whenever a group whose facts were taken is gone (once added)."""
    if listener not in _gone_listeners:
        _gone_listeners.append(listener)


def id_keyed() -> IdKeyedCache:
    """A new cache keyed by group ids (see ``IdKeyedCache``)."""
    cache = IdKeyedCache()
    _id_keyed.add(cache)
    return cache


def _registered_ranks(c10d: Any, pg: Any) -> tuple[int, ...] | None:
    """The group's global ranks, where torch registered the group (``init_process_group``,
    ``new_group``, a DeviceMesh); None for one built directly or implemented in Python."""
    try:
        return tuple(c10d.get_process_group_ranks(pg))
    except Exception:  # KeyError: not registered
        return None


def _text(pg: Any, attribute: str) -> str:
    """A name the group may not have (a Backend built directly has none) or may refuse to give
    (a group implemented in Python: "ProcessGroup name not set"): "" then."""
    try:
        value = getattr(pg, attribute)
    except Exception:
        return ""
    return value if isinstance(value, str) else ""


def resolve_c10d(group: Any) -> Any:
    """The ProcessGroup a c10d call runs on (``None`` is the default group)."""
    if group is not None:
        return group
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    # torch's own state, read directly: GroupMember.WORLD is a chain of two properties
    world = getattr(getattr(c10d, "_world", None), "_default_pg", None)
    if world is None:
        world = c10d.GroupMember.WORLD
    if world is None:
        raise ValueError("the default process group is not initialized")
    return world


def resolve_boxed(group: Any) -> Any:
    """The ProcessGroup a ``c10d::`` op was given: the dispatcher passes it boxed (a
    ScriptObject); ``ProcessGroup.unbox`` gives back the very Python object."""
    if not _UNBOX:
        _UNBOX.append(sys.modules["torch.distributed.distributed_c10d"].ProcessGroup.unbox)
    return _UNBOX[0](group)


_UNBOX: list[Any] = []  # ProcessGroup.unbox, once looked up


def resolve_any(group: Any, tag: str = "") -> Any:
    """The ProcessGroup of a functional-collective group: a ProcessGroup, a list of ranks, a
    DeviceMesh, ``(mesh, dim)``, or a group name."""
    if group is None:
        return resolve_c10d(None)
    c10d = sys.modules["torch.distributed.distributed_c10d"]  # imported: a collective ran
    if isinstance(group, c10d.ProcessGroup):
        return group
    if isinstance(group, str):  # what the ops pass (compiled code)
        return c10d._resolve_process_group(group)
    if isinstance(group, tuple) and len(group) == 2 and hasattr(group[0], "get_group"):
        mesh, dim = group
        return mesh.get_group(dim)
    if hasattr(group, "get_group") and hasattr(group, "ndim"):  # a DeviceMesh
        if group.ndim != 1:
            raise ValueError("only a 1-D DeviceMesh names one group; pass (mesh, dim)")
        return group.get_group(0)
    from torch.distributed import _functional_collectives as funcol

    return c10d._resolve_process_group(funcol._resolve_group_name(group, tag))


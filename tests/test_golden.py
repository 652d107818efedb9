"""Every golden eager-NCCL call, replayed on real 2-rank groups: the annotation the agent records
must equal the args the profiler put on the eager NCCL kernel, field for field, JSON types and
key order included; the CPU keys must equal the ``record_param_comms`` op's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import golden_cases
import pytest
import torch
from harness import run_ranks

from autoannot.describe import vocabulary as V

GOLDEN = Path(__file__).parent / "data" / "golden"
VOCABULARY = set(V.KERNEL_KEYS) | set(V.CPU_ONLY_KEYS)
WORLD = 2


def load_golden(rank: int) -> dict[str, Any]:
    data = json.loads((GOLDEN / f"golden_rank{rank}.json").read_text())
    return {k: v for k, v in data.items() if isinstance(v, list) and not k.startswith("__")}


def vocab(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in args.items() if k in VOCABULARY}


def golden_kernels(events: list[dict]) -> list[dict]:
    return [vocab(e["args"]) for e in events
            if e["cat"] == "kernel" and V.COLLECTIVE_NAME in e["args"]]


def golden_cpu_ops(events: list[dict]) -> list[dict]:
    return [vocab(e["args"]) for e in events if e["name"] == "record_param_comms"
            and e["args"][V.COLLECTIVE_NAME] != "wait"]


def kernel_part(annotation: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in annotation.items() if k not in (V.NAME, V.STREAM)}


def typed(items: list[dict]) -> list[list[tuple[str, str, Any]]]:
    """Keys in order, with each value's JSON type: a bug in any of them shows."""
    return [[(k, type(v).__name__, v) for k, v in d.items()] for d in items]


def _sorted(d: dict[str, Any]) -> dict[str, Any]:
    return dict(sorted(d.items()))


@pytest.fixture(scope="module")
def replays() -> dict[str, list[dict]]:
    return {
        "gloo": run_ranks(golden_cases.replay, WORLD, "gloo", (golden_cases.GLOO_CANNOT_RUN,)),
        "fake": run_ranks(golden_cases.replay, WORLD, "fake"),
    }


def _via_ops(**environment: str) -> dict[str, list[dict]]:
    """The golden calls with the proxies taken out: what a C++ caller of the same collectives
    (DDP's reducer, an extension) gets from the layer below the Python API."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environment.items():
            patch.setenv(name, value)
        return {
            "gloo": run_ranks(golden_cases.replay, WORLD, "gloo",
                              (golden_cases.GLOO_CANNOT_RUN, "ops")),
            "fake": run_ranks(golden_cases.replay, WORLD, "fake", (frozenset(), "ops")),
        }


@pytest.fixture(scope="module")
def replays_via_ops() -> dict[str, list[dict]]:
    """Through the Python layer (its dispatcher kernels)."""
    return _via_ops(AUTOANNOT_NATIVE="0", AUTOANNOT_GROUP_HOOKS="0")


@pytest.fixture(scope="module")
def replays_via_observer(native_build) -> dict[str, list[dict]]:
    """Through the native observer (torch's RecordFunction callbacks)."""
    return _via_ops(AUTOANNOT_NATIVE="1", AUTOANNOT_NATIVE_DIR=str(native_build.parent.parent),
                    AUTOANNOT_GROUP_HOOKS="0")


@pytest.fixture(scope="module")
def replays_via_group_hooks() -> dict[str, list[dict]]:
    """Through torch's process-group hooks (torch >= 2.14), the observer where torch has them."""
    from autoannot.observe import group_hooks

    if not group_hooks.available():
        pytest.skip("this torch's process groups take no collective hooks (torch < 2.14)")
    return _via_ops(AUTOANNOT_GROUP_HOOKS="1")


#: Torch 2.14's hooks name a launch's kind, not its op: one tensor in and one out is read as
#: the coalesced form funcol launches (2.15's hooks name the op).
READ_AS_BY_KIND = {"_allgather_base": "allgather_into_tensor_coalesced",
                   "_reduce_scatter_base": "reduce_scatter_tensor_coalesced"}
#: What torch's hooks do not tell, by the op they report: left out of the annotation.
UNTOLD_BY_HOOKS = {"c10d.alltoall_base_": (V.IN_SPLIT, V.OUT_SPLIT)}


def _left_out(records: list[dict]) -> set[str]:
    """The fields the hooks were not told for these records: absent from each (never
    invented)."""
    left_out: set[str] = set()
    for record in records:
        for field in UNTOLD_BY_HOOKS.get(record["api"], ()):
            assert field not in record["annotation"], (record["api"], field)
            left_out.add(field)
    return left_out


LABELS = sorted(load_golden(0))


def compare(label: str, rank: int, records: list[dict],
            launched: dict[str, list[str]] | None = None, left_out: tuple[str, ...] = (),
            read_as: dict[str, str] | None = None) -> None:
    """``launched``: the c10d functions the installed torch called for the object
    collectives (they differ by release): the golden records of 2.11 are adapted to them.
    ``left_out``: fields the observer was not told, absent from its records (not compared);
    ``read_as``: collective names the observer reads as another (torch 2.14's hooks)."""
    events = load_golden(rank)[label]
    if read_as:
        events = [{**e, "args": {**e["args"], V.COLLECTIVE_NAME: read_as.get(
            e["args"].get(V.COLLECTIVE_NAME), e["args"].get(V.COLLECTIVE_NAME))}}
                  if V.COLLECTIVE_NAME in e["args"] else e for e in events]
    if label == "batch_isend_irecv":
        # NCCL coalesces the batch into one kernel with no args; gloo and fake launch each op
        # alone, which the agent annotates alone: compare with the CPU send and recv records.
        assert [kernel_part(r["annotation"]) for r in records] == [
            {k: v for k, v in op.items() if k not in V.CPU_ONLY_KEYS}
            for op in golden_cpu_ops(events)]
    else:
        expected = [{k: v for k, v in e.items() if k not in left_out}
                    for e in golden_kernels(events)]
        got = [kernel_part(r["annotation"]) for r in records]
        if label.endswith("_object"):  # pickled payload sizes depend on the torch version
            expected, got = expected[:1], got[:1]
            first = (launched or {}).get(label, [None])[0]
            if first is not None:  # the size exchange this torch launches
                from autoannot.describe import collectives

                name = collectives.lookup(first).eager_name
                expected = [{**expected[0], V.COLLECTIVE_NAME: name}]
        assert typed(got) == typed(expected)
    if not any(r.get("described") for r in records):
        expected_cpu = [{k: v for k, v in e.items() if k not in left_out}
                        for e in golden_cpu_ops(events)]
        got_cpu = [r["param_comms"] for r in records]
        if label.endswith("_object"):
            expected_cpu, got_cpu = expected_cpu[:1], got_cpu[:1]
            first = (launched or {}).get(label, [None])[0]
            if first is not None:
                from autoannot.describe import collectives

                name = collectives.lookup(first).eager_name
                expected_cpu = [{**expected_cpu[0], V.COLLECTIVE_NAME: name}]
        assert typed(list(map(_sorted, got_cpu))) == typed(list(map(_sorted, expected_cpu)))
    for r in records:
        assert r["annotation"][V.NAME] == r["api"]
        assert r["annotation"][V.STREAM] >= V.FIRST_LANE


@pytest.mark.parametrize("rank", range(WORLD))
@pytest.mark.parametrize("label", [x for x in LABELS if x not in golden_cases.GLOO_CANNOT_RUN])
def test_golden_on_gloo(replays, label: str, rank: int) -> None:
    result = replays["gloo"][rank][label]
    if isinstance(result, dict) and "torch_cannot" in result:
        pytest.skip(f"gloo of torch {torch.__version__} cannot run it, with the agent off "
                    f"too ({result['torch_cannot']}); checked on the fake group")
    assert not isinstance(result, dict), result
    compare(label, rank, result, replays["gloo"][rank]["#launched"])


@pytest.mark.parametrize("rank", range(WORLD))
@pytest.mark.parametrize("label", [x for x in LABELS if x not in golden_cases.FAKE_CANNOT_RUN])
def test_golden_on_fake_group(replays, label: str, rank: int) -> None:
    result = replays["fake"][rank][label]
    assert not isinstance(result, dict), result
    compare(label, rank, result, replays["fake"][rank]["#launched"])


def _backend(replays: dict[str, list[dict]], rank: int, label: str) -> str:
    """gloo, unless gloo cannot run the call (always, or on this torch with the agent off)."""
    result = replays["gloo"][rank].get(label)
    cannot = isinstance(result, dict) and "torch_cannot" in result
    return "fake" if label in golden_cases.GLOO_CANNOT_RUN or cannot else "gloo"


def test_golden_count(replays, figures) -> None:
    """Every golden call on both ranks: on gloo where gloo runs it, else on the fake group."""
    matched = 0
    for rank in range(WORLD):
        for label in LABELS:
            backend = _backend(replays, rank, label)
            compare(label, rank, replays[backend][rank][label],
                    replays[backend][rank]["#launched"])
            matched += 1
    total = len(LABELS) * WORLD
    figures["golden calls reproduced (label x rank)"] = f"{matched}/{total}"
    assert matched == total


FIXTURES = {"python layer": "replays_via_ops", "native observer": "replays_via_observer",
            "group hooks": "replays_via_group_hooks"}


@pytest.mark.parametrize("layer", list(FIXTURES))
def test_golden_below_the_python_api(layer: str, request, figures) -> None:
    """Every golden call, with no proxy in the way: the c10d:: ops (and the _c10d_functional
    ones for funcol), seen by the Python layer's kernels, by the native observer or by
    torch's process-group hooks, give the eager records, field for field — but for what the
    hooks are not told (an all_to_all_single's split sizes), which they leave out."""
    replays_via_ops = request.getfixturevalue(FIXTURES[layer])
    read_as = None
    if layer == "group hooks":
        from autoannot.observe import group_hooks

        if not group_hooks._names_ops(torch._C._distributed_c10d.HookOpName):
            read_as = READ_AS_BY_KIND
    matched, layers, untold, read_otherwise = 0, set(), set(), set()
    for rank in range(WORLD):
        for label in LABELS:
            backend = _backend(replays_via_ops, rank, label)
            records = replays_via_ops[backend][rank][label]
            assert not isinstance(records, dict), (label, records)
            left_out: set[str] = set()
            if layer == "group hooks":
                left_out = _left_out(records)
                if left_out:
                    untold.add(label)
            if read_as and any(e["args"].get(V.COLLECTIVE_NAME) in read_as
                               for e in load_golden(rank)[label]):
                read_otherwise.add(label)
            compare(label, rank, records, replays_via_ops[backend][rank]["#launched"],
                    tuple(left_out), read_as)
            layers |= {r["api"].split(".")[0] for r in records if not r.get("described")}
            matched += 1
    total = len(LABELS) * WORLD
    whole = total - len(untold | read_otherwise) * WORLD
    said = [f"split sizes left out of {sorted(untold)}"] if untold else []
    if read_otherwise:
        said.append(f"the coalesced form read for {sorted(read_otherwise)}")
    figures[f"golden calls reproduced through the c10d:: ops, no proxy, {layer} "
            "(label x rank)"] = (f"{matched}/{total}" if not said else
                                 f"{matched}/{total} ({whole} whole; {'; '.join(said)})")
    assert matched == total
    assert layers == {"c10d", "_c10d_functional"}  # no proxy recorded anything
    for ranks in replays_via_ops.values():  # that observer alone: nothing else was made
        assert all(rank["#observers"] == {way: way == layer for way in FIXTURES}
                   for rank in ranks)
    if layer == "group hooks":  # (funcol's ops are read from torch.ops' frames: their splits)
        assert untold == {"all_to_all_single_equal", "all_to_all_single_splits"}

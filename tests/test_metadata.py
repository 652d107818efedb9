"""The derivation rules on calls, shapes and groups beyond the golden set, on real groups."""

from __future__ import annotations

import pytest
import scenarios
from harness import run_ranks, skip_if_torch_cannot

from autoannot.describe import vocabulary as V


def by_name(records, name):
    return [r for r in records if r["annotation"][V.COLLECTIVE_NAME] == name]


@pytest.fixture(scope="module")
def four_ranks():
    return run_ranks(scenarios.four_rank_groups, 4, "gloo")


def test_strided_subgroup_roots_and_peers(four_ranks) -> None:
    for rank in (1, 3):
        out = four_ranks[rank]
        records = out["records"]
        bcasts = by_name(records, "broadcast")
        assert len(bcasts) == 2
        for b in bcasts:
            a = b["annotation"]
            assert a[V.PG_NAME] == out["odd_name"] and a[V.PG_DESC] == "odd"
            assert a[V.PG_RANKS] == "[1, 3]" and a[V.GROUP_SIZE] == 2
            assert b["param_comms"][V.GLOBAL_RANK_START] == 1
            assert b["param_comms"][V.GLOBAL_RANK_STRIDE] == 2
        assert bcasts[0]["param_comms"][V.RANK] == 1  # src=3 (global) is group rank 1
        assert bcasts[1]["param_comms"][V.RANK] == 0  # group_src=0
        (p2p,) = by_name(records, "send" if rank == 1 else "recv")
        assert p2p["param_comms"][V.RANK] == (1 if rank == 1 else 0)  # the peer, group rank
        if rank == 1:
            assert p2p["annotation"][V.DST_RANK] == 3  # the peer, global rank
        else:
            assert p2p["annotation"][V.SRC_RANK] == 1
        (a2a,) = by_name(records, "all_to_allv")
        assert a2a["annotation"][V.IN_SPLIT] == "[]"


def test_unstrided_group_has_no_stride_key(four_ranks) -> None:
    """A group whose global ranks are not strided: the process group records no stride, and
    rebuilds no ranks from it (ParamCommsDebugInfo lists them only for a positive stride)."""
    for rank in (0, 1, 3):
        out = four_ranks[rank]
        (ar,) = by_name(out["records"], "allreduce")[:1]
        assert ar["annotation"][V.PG_RANKS] == "[]"
        assert ar["annotation"][V.PG_DESC] == "undefined"
        assert ar["annotation"][V.DTYPE] == "Double"
        assert V.GLOBAL_RANK_STRIDE not in ar["param_comms"]
        assert ar["param_comms"][V.GLOBAL_RANK_START] == 0
        assert ar["param_comms"][V.RANK] == [0, 1, None, 2][rank]
        (red,) = by_name(out["records"], "reduce")
        assert red["param_comms"][V.RANK] == 2  # dst=3 (global) is group rank 2


def test_mesh_dimension_groups(four_ranks) -> None:
    for out in four_ranks:
        mesh = out["mesh"]
        funcol_records = [r for r in out["records"] if r["api"].startswith("funcol.")]
        tp_ar, dp_ag, world_rs = funcol_records
        assert tp_ar["annotation"][V.PG_NAME] == mesh["tp"]["name"]
        assert tp_ar["annotation"][V.PG_DESC] == mesh["tp"]["desc"]
        assert mesh["tp"]["desc"].startswith("mesh_")
        assert tp_ar["annotation"][V.PG_RANKS] == V.format_list(mesh["tp"]["ranks"])
        assert dp_ag["annotation"][V.PG_NAME] == mesh["dp"]["name"]
        assert dp_ag["annotation"][V.OUT_NELEMS] == 16
        assert world_rs["annotation"][V.PG_RANKS] == "[0, 1, 2, 3]"
        assert world_rs["annotation"][V.OUT_NELEMS] == 2
        assert tp_ar["annotation"][V.STREAM] != dp_ag["annotation"][V.STREAM]  # one lane each
        c10d_ag = out["records"][-1]
        assert c10d_ag["annotation"][V.PG_NAME] == mesh["tp"]["name"]
        assert c10d_ag["annotation"][V.STREAM] == tp_ar["annotation"][V.STREAM]


def test_lists_longer_than_thirty_are_truncated_like_the_profiler() -> None:
    (records,) = run_ranks(scenarios.wide_world, 40, "fake", ranks=(7,))
    a2a, complex_ar, complex_reduce = (r["annotation"] for r in records)
    first29 = ", ".join(str(i) for i in range(29))
    assert a2a[V.PG_RANKS] == f"[{first29}, ..., 39]"
    assert a2a[V.IN_SPLIT] == f"[{first29}, ..., 39]" == a2a[V.OUT_SPLIT]
    assert a2a[V.IN_NELEMS] == sum(range(40))
    # c10d sends complex tensors as view_as_real for all_reduce, not for reduce
    assert (complex_ar[V.DTYPE], complex_ar[V.IN_NELEMS]) == ("Float", 16)
    assert (complex_reduce[V.DTYPE], complex_reduce[V.IN_NELEMS]) == ("ComplexFloat", 8)


def test_point_to_point_in_a_coalescing_block_is_one_launch_without_args() -> None:
    results = run_ranks(scenarios.coalesced_point_to_point, 2, "gloo")
    skip_if_torch_cannot(results)
    for records in results:
        assert [r["api"] for r in records] == ["_coalescing_manager"]
        assert set(records[0]["annotation"]) == {V.NAME, V.STREAM}
        assert records[0]["param_comms"] == {}


def test_functional_collective_forms() -> None:
    expected = {  # call -> (Collective name, in, out, in splits, out splits) on rank 0 of 2
        "all_reduce": ("allreduce", 6, 6, "[]", "[]"),
        "all_reduce_coalesced": ("allreduce_coalesced", 5, 5, "[]", "[]"),
        "all_gather_tensor": ("allgather_into_tensor_coalesced", 6, 12, "[]", "[]"),
        "all_gather_tensor_autograd": ("allgather_into_tensor_coalesced", 6, 12, "[]", "[]"),
        "all_gather_into_tensor_coalesced": ("allgather_into_tensor_coalesced", 6, 12, "[]",
                                             "[]"),
        "reduce_scatter_tensor": ("reduce_scatter_tensor_coalesced", 6, 3, "[]", "[]"),
        "reduce_scatter_tensor_autograd": ("reduce_scatter_tensor_coalesced", 6, 3, "[]", "[]"),
        "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", 6, 3, "[]", "[]"),
        "all_to_all_single": ("all_to_allv", 12, 12, "[5, 1]", "[5, 1]"),
        "all_to_all_single_autograd": ("all_to_allv", 6, 6, "[3, 3]", "[3, 3]"),
        "broadcast": ("broadcast", 6, 6, "[]", "[]"),
    }
    rank0 = run_ranks(scenarios.functional_forms, 2, "gloo")[0]
    seen = {}
    for item in rank0:
        (record,) = item["records"]  # nested funcol calls give one record, not two
        a = record["annotation"]
        seen[item["call"]] = (a[V.COLLECTIVE_NAME], a[V.IN_NELEMS], a[V.OUT_NELEMS],
                              a[V.IN_SPLIT], a[V.OUT_SPLIT])
        assert record["api"] == f"funcol.{item['call']}"
    assert seen == {k: v for k, v in expected.items() if k in seen}
    assert {"all_reduce", "all_gather_tensor", "reduce_scatter_tensor",
            "all_to_all_single", "broadcast"} <= set(seen)

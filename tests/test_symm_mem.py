"""Issue 38: the symmetric-memory collectives (``torch.ops.symm_mem``: async tensor
parallelism's and the custom all-reduces) are annotated as torch records them, on real gloo
ranks: no process group call is made for them, so no hook sees them; a proxy of each op does
(its packet and its overloads), on every torch. Torch runs them on CUDA only: the test gives
them CPU kernels of its own (``symm_mem_cases``); on the device, ``tests/gpu/symm_mem.py``
runs torch's own."""

from __future__ import annotations

import symm_mem_cases as cases
from harness import run_job, run_ranks


def test_every_symm_mem_collective_is_recorded_as_torch_records_it() -> None:
    """Each of the 12 ops, on the default group and on a group of its own, packet and overload:
    one record each, equal to what torch's RECORD_PARAM_COMMS holds for the call (written from
    its source), with no kernel of the agent on the dispatcher; the results are those of the
    agent off, and ``disable()`` gives back torch's own packets and overloads."""
    for result in run_ranks(cases.every_op, 2):
        assert [api for api, _ in result["records"]] == [
            f"symm_mem.{op}" for op in result["ops"]]
        for (api, recorded), cpu_only, truth in zip(result["records"], result["cpu_only"],
                                                     result["truth"], strict=True):
            recorded = {k: v for k, v in recorded.items() if k not in ("name", "stream")}
            assert {**recorded, **cpu_only} == truth, api
        assert result["same_results"] and result["restored"]
        assert result["agent_kernels"] == []


def test_the_record_file_holds_each_symm_mem_launch(tmp_path) -> None:
    """``AUTOANNOT=1`` and ``AUTOANNOT_RECORD``, as users run a job: each launch in the file,
    in order, with its call site (the agent is on from the start: both rounds of calls)."""
    for result in run_job(cases.every_op, 2, tmp_path):
        lines = [line for line in result["journal"] if line.get("api", "").startswith(
            "symm_mem.")]
        assert [line["api"] for line in lines] == [api for api, _ in result["records"]] * 2
        assert {line["call_site"].rsplit(":", 1)[0] for line in lines} == {cases.__file__}
        assert [line["annotation"] for line in lines[len(lines) // 2:]] == [
            annotation for _, annotation in result["records"]]


def test_compiled_code_launches_are_recorded_as_eager_ones() -> None:
    """``torch.compile(fullgraph=True)``: no graph break, the same result, and the compiled
    code's launches recorded as the eager calls are."""
    for result in run_ranks(cases.compiled, 2):
        assert result["graph_breaks"] == 0 and result["same_result"]
        assert result["compiled"] == result["eager"]
        assert [api for api, _ in result["eager"]] == ["symm_mem.one_shot_all_reduce",
                                                       "symm_mem.one_shot_all_reduce_copy"]


def test_graphed_symm_mem_kernels_of_a_real_replay_get_their_ledger_entries(tmp_path) -> None:
    """Real traces (``tests/gpu/symm_mem.py``, one H200, torch 2.11: the 5 ops a 1-rank group
    without multicast runs — one_shot_all_reduce and its _out, _copy, _copy_out forms,
    two_shot_all_reduce_ — captured and replayed twice): annotated offline, each graphed
    symm_mem kernel carries its ledger entry's args, in capture order; torch 2.11's eager
    kernels carry none (it records nothing for these ops, 0 record_param_comms: the
    annotation is the table's, by the rules of torch's later record)."""
    import json
    import shutil
    from pathlib import Path

    from autoannot.describe import vocabulary as V
    from autoannot.traces.read import annotate as tracetool

    data = Path(__file__).parent / "data" / "gpu" / "symm_mem"
    for name in ("graph_rank0.json", "graph_rank0.autoannot"):
        shutil.copy(data / name, tmp_path / name)
    report = tracetool.annotate_file(tmp_path / "graph_rank0.json", tmp_path / "out.json")
    ledger = json.loads((data / "graph_rank0.autoannot").read_text())["graphs"]
    (entries,) = ledger.values()

    def kernels(path: Path) -> list[dict]:
        events = json.loads(path.read_text())["traceEvents"]
        return sorted((e for e in events if e.get("cat") == "kernel"
                       and tracetool.kernel_family(e["name"])), key=lambda e: e["ts"])

    annotated = kernels(tmp_path / "out.json")
    assert (report.kernels_annotated, report.kernels_left) == (2 * len(entries), 0)
    assert [{k: v for k, v in e["args"].items() if k in V.KERNEL_KEYS} for e in annotated] == [
        {k: v for k, v in entry["annotation"].items() if k in V.KERNEL_KEYS}
        for entry in entries] * 2
    assert [tracetool.kernel_family(e["name"]) for e in annotated] == [
        next(iter(entry["kernels"])) for entry in entries] * 2
    eager = kernels(data / "eager_rank0.json")
    assert len(eager) == len(entries)
    assert not any(V.COLLECTIVE_NAME in e.get("args", {}) for e in eager)


def test_the_ops_pickle_and_copy_as_with_the_agent_off() -> None:
    """A proxied op reads as the op: pickling raises what torch raises (before, it pickled to
    a reference that loaded as None), a copy is torch's copy, a deep copy the op in place.
    (``copy.copy`` of a packet recurses in torch itself: not tried.)"""
    import copy
    import pickle

    import torch

    import autoannot

    def outcomes() -> list[tuple]:
        found = []
        packet = torch.ops.symm_mem.one_shot_all_reduce
        for obj in (packet, packet.default):
            try:
                pickle.dumps(obj)
                found.append(("pickled",))
            except Exception as exc:
                found.append((type(exc).__name__, str(exc).split(" object at ")[0]))
        overload = packet.default
        found.append((type(copy.copy(overload)).__name__, copy.copy(overload) is overload))
        found.append((copy.deepcopy(overload) is overload,))
        return found

    was_on = autoannot.is_enabled()
    autoannot.disable()
    off = outcomes()
    autoannot.enable()
    try:
        assert type(torch.ops.symm_mem.one_shot_all_reduce.default).__name__ == "OpProxy"
        assert outcomes() == off
    finally:
        if not was_on:
            autoannot.disable()

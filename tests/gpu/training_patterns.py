"""On 2 GPUs with NCCL: graphed training as users run it. Every graphed NCCL kernel of every
profiled replay must carry the eager kernel args of the same call, on both ranks.

    AUTOANNOT=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=0 PYTHONPATH=autoannot/_hook:. \\
        python tests/gpu/training_patterns.py OUT_DIR

The bodies hold no autoannot code (the agent is on through ``AUTOANNOT=1``). Each pattern
profiles its eager twin (the reference kernel args), captures, profiles 3 replays, then the
traces are annotated offline and compared, replay by replay:

* ``ddp``: DistributedDataParallel, the whole step (forward, backward, ``optimizer.step()``)
  in one graph, PyTorch's recipe: DDP built in a side-stream context, 11 eager warm-up steps.
  The gradient all-reduces come from DDP's C++ reducer on autograd's device thread.
* ``graphed``: ``torch.cuda.make_graphed_callables`` over Megatron-style tensor-parallel
  blocks: an all_reduce in one autograd Function's forward and in another's backward (run by
  autograd's device thread, on a stream joined to the backward capture).
* ``compiled``: ``torch.compile(mode="reduce-overhead")`` of funcol's autograd all_gather /
  reduce_scatter, forward and backward graphs (CUDA graph trees).
* ``mixed``: one graph of Python-API calls and C++-origin ones (``ProcessGroup.allreduce``,
  ``dist._broadcast_coalesced`` as DDP syncs module states) and a functional collective.
* ``threads``: two captures in progress at once on two threads (``thread_local`` capture
  mode), one process group each.
* ``inference``: a tensor-parallel decoder, one graph per batch size (1, 2, 4) sharing a memory
  pool, a decode loop profiled step by step (``ProfilerStep``, CUDA sync events: what HTA's
  critical path needs); its whole trace is also kept untrimmed (``full_rank<r>.json``).

``PATTERNS=ddp,mixed`` runs a subset (each pattern can run in its own process, into the same
OUT_DIR); ``CAPTURE_IDENTITY=capture-id`` makes the agent tie launches to captures through the
driver's ``cuStreamGetCaptureInfo`` even where torch's ``get_currently_capturing_graph``
exists; ``DUMP_AFTER=SECONDS`` dumps every thread's stack if a run takes longer (a hang).

Writes per pattern ``OUT/<pattern>/{eager,graph}_rank<r>.json`` (+ ledgers), its report and
``meta.json`` (how the eager kernels split into the bodies the replays run, in turn); prints
the counts and exits 1 on any difference. ``verify OUT`` re-checks a finished run.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
import agent_hooks as hooks
from harness import launch_on_gpus

REPLAYS = 3
ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def _profiled(fn: Callable[[], Any], path: Path) -> None:
    with profile(activities=ACTIVITIES) as prof:
        fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))


def _replayed(replay: Callable[[], Any], path: Path) -> None:
    def run() -> None:
        for _ in range(REPLAYS):
            replay()
    _profiled(run, path)


# --- ddp -------------------------------------------------------------------------------------

def ddp(rank: int, out: Path) -> list[int] | None:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 16)).cuda()
    x = torch.randn(32, 256, device="cuda") + rank
    y = torch.randn(32, 16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        net = DistributedDataParallel(model, device_ids=[rank], bucket_cap_mb=0.25)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01)

        def step() -> None:
            F.mse_loss(net(x), y).backward()
            optimizer.step()

        for _ in range(11):
            optimizer.zero_grad(set_to_none=True)
            step()
        optimizer.zero_grad(set_to_none=True)
        _profiled(step, out / f"eager_rank{rank}.json")  # the reference: one more eager step
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    _replayed(graph.replay, out / f"graph_rank{rank}.json")
    return None  # one body: the step


# --- graphed ---------------------------------------------------------------------------------

class _CopyToTP(torch.autograd.Function):
    """Megatron's copy_to_tensor_model_parallel_region: identity, all_reduce of the grad."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)  # on autograd's device thread
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's reduce_from_tensor_model_parallel_region: all_reduce, identity grad."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class TPBlock(torch.nn.Module):
    def __init__(self, group: Any) -> None:
        super().__init__()
        self.group = group
        self.column = torch.nn.Linear(64, 128)
        self.row = torch.nn.Linear(128, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.column(_CopyToTP.apply(x, self.group)))
        return _ReduceFromTP.apply(self.row(h), self.group)


def graphed(rank: int, out: Path, tp: Any) -> list[int]:
    torch.manual_seed(0)
    blocks = torch.nn.Sequential(TPBlock(tp), TPBlock(tp)).cuda()
    x = torch.randn(16, 64, device="cuda", requires_grad=True)

    def step(module: Any) -> None:
        module(x).sum().backward()

    for _ in range(2):
        step(blocks)
    _profiled(lambda: step(blocks), out / f"eager_rank{rank}.json")
    graphed_blocks = torch.cuda.make_graphed_callables(blocks, (x,))
    _replayed(lambda: step(graphed_blocks), out / f"graph_rank{rank}.json")
    return [2, 2]  # forward graph: 2 all_reduces; backward graph: 2


# --- compiled --------------------------------------------------------------------------------

def compiled(rank: int, out: Path, tp: Any) -> list[int]:
    def tp_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        gathered = funcol.all_gather_tensor_autograd(x, 0, tp)
        y = torch.relu(gathered @ w1) @ w2
        return funcol.reduce_scatter_tensor_autograd(y, "sum", 0, tp)

    torch.manual_seed(0)
    x = torch.randn(8, 64, device="cuda", requires_grad=True)
    w1 = torch.randn(64, 128, device="cuda", requires_grad=True)
    w2 = torch.randn(128, 64, device="cuda", requires_grad=True)

    def step(fn: Any) -> None:
        torch.compiler.cudagraph_mark_step_begin()
        # square(): a contiguous gradient (funcol's autograd backward wants one on torch 2.11)
        funcol.wait_tensor(fn(x, w1, w2)).square().sum().backward()

    for _ in range(2):
        step(tp_mlp)
    _profiled(lambda: step(tp_mlp), out / f"eager_rank{rank}.json")
    fast = torch.compile(tp_mlp, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # compile, warm up, record the trees
        step(fast)
    torch.cuda.synchronize()
    _replayed(lambda: step(fast), out / f"graph_rank{rank}.json")
    return [2, 2]  # forward: all_gather, reduce_scatter; backward: their transposes


# --- mixed -----------------------------------------------------------------------------------

def mixed(rank: int, out: Path, tp: Any) -> list[int] | None:
    world = dist.group.WORLD
    a, b, c = (torch.full((n,), float(rank + 1), device="cuda") for n in (1000, 2000, 300))
    d = torch.arange(77, device="cuda", dtype=torch.float32)
    e = torch.ones(512, device="cuda", dtype=torch.bfloat16)

    def body() -> None:
        dist.all_reduce(a)  # Python API
        world.allreduce([b]).wait()  # the ProcessGroup itself: no proxy sees it
        dist._broadcast_coalesced(tp, [c, d], 1 << 20, 0)  # C++, as DDP syncs module states
        funcol.wait_tensor(funcol.all_reduce(e, "max", tp))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
        _profiled(body, out / f"eager_rank{rank}.json")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    _replayed(graph.replay, out / f"graph_rank{rank}.json")
    return None


# --- threads ---------------------------------------------------------------------------------

def threads(rank: int, out: Path, tp: Any) -> list[int]:
    g1 = dist.new_group([0, 1], group_desc="left")
    g2 = dist.new_group([0, 1], group_desc="right")
    left = [torch.ones(n, device="cuda") for n in (1000, 2000, 3000)]
    right = [torch.ones(n, device="cuda", dtype=torch.bfloat16) for n in (400, 500)]
    shared = torch.ones(64, device="cuda")

    def body_left() -> None:
        for t in left:
            dist.all_reduce(t, group=g1)

    def body_right() -> None:
        for t in right:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g2)
        dist.broadcast(shared, 0, group=g2)

    for body in (body_left, body_right):  # communicators up before any capture
        body()
    torch.cuda.synchronize()
    _profiled(lambda: (body_left(), body_right()), out / f"eager_rank{rank}.json")

    both_inside = threading.Barrier(2)
    graphs = [torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()]
    errors: list[str] = []

    def capture(graph: Any, body: Callable[[], None]) -> None:
        try:
            torch.cuda.set_device(rank)  # the current device is per thread (0 in a new one)
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                graph.capture_begin(capture_error_mode="thread_local")
                both_inside.wait()  # the two captures are in progress together
                body()
                both_inside.wait()
                graph.capture_end()
        except BaseException:
            errors.append(traceback.format_exc())
            both_inside.abort()

    workers = [threading.Thread(target=capture, args=(graph, body))
               for graph, body in zip(graphs, (body_left, body_right), strict=True)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise RuntimeError(errors[0])
    torch.cuda.synchronize()

    def replay() -> None:
        graphs[0].replay()
        graphs[1].replay()

    _replayed(replay, out / f"graph_rank{rank}.json")
    return [3, 3]


# --- inference -------------------------------------------------------------------------------

BATCH_SIZES = (1, 2, 4)


def inference(rank: int, out: Path, tp: Any) -> list[int]:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(256, 256).cuda() for _ in range(2)]

    @torch.no_grad()
    def forward(x: torch.Tensor) -> torch.Tensor:
        for layer in layers:  # row-parallel: a partial sum on each rank, all-reduced
            x = layer(x)
            dist.all_reduce(x, group=tp)
        return x

    inputs = {b: torch.randn(b, 256, device="cuda") for b in BATCH_SIZES}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for b in BATCH_SIZES:
            forward(inputs[b])
    torch.cuda.current_stream().wait_stream(side)
    _profiled(lambda: [forward(inputs[b]) for b in BATCH_SIZES], out / f"eager_rank{rank}.json")

    pool = torch.cuda.graph_pool_handle()  # one pool, a graph per batch size
    graphs, outputs = {}, {}
    for b in reversed(BATCH_SIZES):  # largest first, as servers do
        graphs[b] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[b], pool=pool):
            outputs[b] = forward(inputs[b])
    torch.cuda.synchronize()

    steps = 2 * len(BATCH_SIZES)
    config = torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    schedule = torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1)
    with profile(activities=ACTIVITIES, schedule=schedule, experimental_config=config) as prof:
        for step in range(steps):
            b = BATCH_SIZES[step % len(BATCH_SIZES)]
            inputs[b].copy_(torch.randn(b, 256, device="cuda"))
            graphs[b].replay()
            token = outputs[b].argmax(dim=-1)
            token.cpu()  # the host waits for the step, as a sampler does
            prof.step()
    torch.cuda.synchronize()
    prof.export_chrome_trace(str(out / f"graph_rank{rank}.json"))
    for suffix in (".json", ".autoannot"):  # a copy kept whole, for HTA (kineto saves once)
        shutil.copyfile(out / f"graph_rank{rank}{suffix}", out / f"full_rank{rank}{suffix}")
    return [2] * len(BATCH_SIZES)


#: Graph launches a pattern profiles, where not REPLAYS per body.
EXPECTED_REPLAYS = {"inference": 2 * len(BATCH_SIZES)}

PATTERNS: dict[str, Callable[..., list[int] | None]] = {
    "ddp": lambda rank, out, tp: ddp(rank, out),
    "graphed": graphed, "compiled": compiled, "mixed": mixed, "threads": threads,
    "inference": inference,
}


def worker(rank: int, world: int, out_dir: str, port: int) -> None:
    import faulthandler


    if os.environ.get("DUMP_AFTER"):
        faulthandler.dump_traceback_later(float(os.environ["DUMP_AFTER"]), exit=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    tp = dist.new_group(list(range(world)), group_desc="tp")
    if os.environ.get("CAPTURE_IDENTITY") == "capture-id":
        hooks.AGENT.captures.identity = hooks.identity(hooks.capture_identity.ByCaptureId())
    selected = os.environ.get("PATTERNS", ",".join(PATTERNS)).split(",")
    for name in selected:
        folder = Path(out_dir) / name
        folder.mkdir(parents=True, exist_ok=True)
        before = set(hooks.LEDGERS)
        report: dict[str, Any] = {"rank": rank, "torch": torch.__version__}
        print(f"rank {rank}: {name}", flush=True)
        try:
            report["sizes"] = PATTERNS[name](rank, folder, tp)
            report["ledgers"] = {graph: [entry["api"] for entry in hooks.LEDGERS[graph].entries]
                                 for graph in hooks.LEDGERS if graph not in before}
        except Exception:
            report["error"] = traceback.format_exc()
        report["capture_identity"] = hooks.AGENT.captures.identity.how
        (folder / f"report_rank{rank}.json").write_text(json.dumps(report, indent=1))
        print(f"rank {rank}: {name} {'failed' if 'error' in report else 'done'}", flush=True)
        torch.cuda.synchronize()
        dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # NCCL teardown with live graphs can hang; the traces are written


def verify(out: Path, world: int = 2) -> int:
    """Annotate each pattern's graph traces offline and compare them with the eager twins."""
    import verify_traces

    from autoannot.traces.read import annotate as tracetool

    ok, summary, ledgers, how = True, {}, {}, ""
    for name in PATTERNS:
        folder = out / name
        if not (folder / "report_rank0.json").exists():
            continue
        reports = [json.loads((folder / f"report_rank{r}.json").read_text())
                   for r in range(world)]
        how = reports[0].get("capture_identity", how)
        ledgers[name] = [report.get("ledgers") for report in reports]
        errors = [report["error"] for report in reports if "error" in report]
        if errors:
            ok = False
            summary[name] = {"error": errors[0][-2000:]}
            continue
        counts = {"kernels": 0, "matching": 0, "problems": []}
        for rank in range(world):
            eager = verify_traces.eager_calls(folder / f"eager_rank{rank}.json")
            sizes = reports[rank]["sizes"] or [len(eager)]
            (folder / "meta.json").write_text(json.dumps({"sizes": sizes}))
            annotated = folder / f"annotated_rank{rank}.json"
            report = tracetool.annotate_file(folder / f"graph_rank{rank}.json", annotated)
            result = verify_traces.compare(annotated, verify_traces.split_bodies(eager, sizes),
                                           skip_empty=True)
            counts["kernels"] += result["kernels"]
            counts["matching"] += result["kernels_matching"]
            counts["problems"] += result["problems"] + report.mismatches
            if result["replays"] != EXPECTED_REPLAYS.get(name, REPLAYS * len(sizes)):
                counts["problems"].append(f"rank {rank}: {result['replays']} replays")
        ok &= not counts["problems"] and counts["kernels"] > 0
        summary[name] = counts
    print(json.dumps({"capture_identity": how, "patterns": summary, "ledgers": ledgers},
                     indent=1))
    print("VERIFIED" if ok else "DIFFERENCES FOUND")
    return 0 if ok else 1


def main() -> int:
    if sys.argv[1:2] == ["verify"]:
        return verify(Path(sys.argv[2]))
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_out")
    if not launch_on_gpus(worker, 2, out):
        return 2
    return verify(out)


if __name__ == "__main__":
    sys.exit(main())

"""What a native ring writer would cost, at its floor: torch's C++ process-group hooks (torch >=
2.14, ``ProcessGroup::registerPreHook`` / ``registerPostHook``, ``c10d/Hooks.hpp``) writing a
32-byte record a launch (entry and return times, a key of the op, dtype and size, the op id)
into memory, no Python, on the DDP job of ``production.py`` (2 gloo ranks, 6 x Linear(256),
~6 launches a step), against no hook: paired rounds, as ``production.py`` pairs them. A
prototype for the issue's <= 1.01x, not the agent's code (it keeps no call site, no kinds).

    python benchmarks/native_hook_floor.py BUILD_DIR [ROUNDS]

Compiles a small torch extension into BUILD_DIR (a C++ compiler and ninja; ~20 s), prints one
line of JSON: the median of round ratios and its 95% bootstrap interval. A benchmark, not a
test."""
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
SRC = r'''
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Hooks.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <time.h>

#include <atomic>
#include <vector>

namespace {
constexpr uint64_t N = 1 << 16;  // records kept, 4 words each
std::vector<uint64_t>& ring = *new std::vector<uint64_t>(N * 4);
std::atomic<uint64_t> count{0};
thread_local uint64_t last = 0;

inline uint64_t now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000ull + t.tv_nsec;
}
}  // namespace

void attach(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, int64_t id) {
  pg->registerPreHook(id, [](const c10d::PreHookArgs& a) {
    uint64_t i = count.fetch_add(1, std::memory_order_relaxed) % N;
    uint64_t key = static_cast<uint64_t>(a.name);
    if (!a.input_tensors.empty()) {
      const auto& t = a.input_tensors[0];
      key = key * 1315423911u ^ static_cast<uint64_t>(t.numel()) ^
            (static_cast<uint64_t>(t.scalar_type()) << 40);
    }
    ring[i * 4] = now();
    ring[i * 4 + 1] = key;
    ring[i * 4 + 2] = a.op_id;
    last = i;
  });
  pg->registerPostHook(id, [](const c10d::PostHookArgs&) { ring[last * 4 + 3] = now(); });
}

void detach(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, int64_t id) {
  pg->unregisterPreHook(id);
  pg->unregisterPostHook(id);
}

uint64_t launches() { return count.load(); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attach", &attach);
  m.def("detach", &detach);
  m.def("launches", &launches);
}
'''

HOOK_ID = 0x666C6F6F


def _build(folder: str) -> Any:
    from torch.utils.cpp_extension import load_inline

    return load_inline("autoannot_native_floor", cpp_sources=[SRC], build_directory=folder,
                       verbose=False)


def _rank(rank: int, world: int, port: int, folder: str, rounds: int, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from production import training_step

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    native = _build(folder)
    step = training_step("ddp", world)
    group = dist.group.WORLD
    for _ in range(30):
        step()
    per_round: dict[str, list[float]] = {"off": [], "native hooks": []}
    for r in range(rounds):
        for mode in (("off", "native hooks") if r % 2 == 0 else ("native hooks", "off")):
            if mode != "off":
                native.attach(group, HOOK_ID)
            for _ in range(3):  # (untimed after a switch)
                step()
            dist.barrier()
            block = []
            for _ in range(steps):
                started = time.perf_counter()
                step()
                block.append(time.perf_counter() - started)
            per_round[mode].append(statistics.median(block))
            if mode != "off":
                native.detach(group, HOOK_ID)
    if rank == 0:
        ratios = [n / o for n, o in zip(per_round["native hooks"], per_round["off"], strict=True)]
        pick = random.Random(0)
        medians = sorted(statistics.median(pick.choices(ratios, k=len(ratios)))
                         for _ in range(2000))
        print(json.dumps({"torch": torch.__version__,
                          "off_ms": statistics.median(per_round["off"]) * 1e3,
                          "native hooks": [round(statistics.median(ratios), 4),
                                           round(medians[50], 4), round(medians[1949], 4)],
                          "launches": native.launches(), "rounds": rounds, "steps": steps}))
    dist.destroy_process_group()
    os._exit(0)  # (past torch's gloo exit race: see tests/harness.py)


def main() -> None:
    import torch.multiprocessing as mp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from harness import free_port

    folder = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    os.makedirs(folder, exist_ok=True)
    _build(folder)  # (once, before the ranks, which would both compile it)
    mp.start_processes(_rank, args=(2, free_port(), folder, rounds, 10), nprocs=2, join=True,
                       start_method="spawn")


if __name__ == "__main__":
    main()

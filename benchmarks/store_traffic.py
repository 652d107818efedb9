"""The live watch's traffic through a c10d store (``AUTOANNOT_WATCH_STORE``), measured on a
local TCPStore (torch's, the server a job's rank 0 runs) with many client processes, scaled
down, and estimated for 65,536 ranks.

Each rank sets two keys in one request (``multi_set``) an interval at most: its launch count
(a few dozen bytes) and its progress document (``live.progress``: a real one, made
here from the ring of a real 1-rank gloo job of 3 groups with the agent on). Rank 0's watcher
reads every rank's count with one ``multi_get`` a look, and the documents only to say a hang
and, no more than a quarter of its time, to look for stragglers. Measured:

* what the server serves: ``--processes`` x ``--threads`` clients (a connection each, as each
  rank has its own) set their key as fast as they can for ``--seconds``, then ``get`` it (a
  set has no reply: the get's answer comes once the server has served every set before it):
  sets a second at saturation, and how long a ``set`` call takes the client;
* the watcher's reads: one ``multi_get`` of ``--ranks`` ranks' counts, and one of their
  documents (set first), their time and bytes.

Then, for 65,536 ranks: requests and bytes a second at each interval, the server's share of
what it served here, and the shortest interval that keeps it under a quarter of that, with
the watcher's read of the counts under half an interval. A fast host serves more: run it where
the store runs (``-o`` keeps the figures).

    python benchmarks/store_traffic.py --processes 8 --threads 8 -o results_store_traffic.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

RANKS_AT_SCALE = 65_536
#: A rank's count as it publishes it: launches, when published (ns), its run.
COUNT = b"123456789 1796361767075439892 20261204T052226-0ba14014"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def real_document() -> bytes:
    """A progress document of a real ring: a 1-rank gloo job of 3 groups, 40 steps of an
    all-reduce on each (the agent on, its ring in a temporary folder)."""
    folder = tempfile.mkdtemp(prefix="autoannot-store-")
    os.environ["AUTOANNOT_RING"] = folder
    import autoannot
    from autoannot.agent.instrumentation import INSTRUMENTATION
    from autoannot.keep import ring as rings

    autoannot.enable()
    ring = rings.open_from_environment(INSTRUMENTATION.state)
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    groups = [None, dist.new_group([0]), dist.new_group([0])]
    tensor = torch.ones(1024)
    for _ in range(40):
        for group in groups:
            dist.all_reduce(tensor, group=group)
    from autoannot.live import progress as rank_progress
    from autoannot.traces.read import ring_files

    assert ring is not None and ring.ring_path is not None
    one = ring_files.read(Path(ring.ring_path), 1024)
    dist.destroy_process_group()
    return rank_progress.encode(rank_progress.of_ring(one, 32, published_ns=time.time_ns()))


def _client(port: int, first_key: int, threads: int, seconds: float, document: bytes,
            out: mp.Queue) -> None:
    """``threads`` connections, each setting its own two keys as fast as it can."""
    import threading

    import torch.distributed as dist

    stores = [dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                            timeout=timedelta(seconds=30)) for _ in range(threads)]
    results: list[tuple[int, list[float]]] = [(0, [])] * threads
    finished = [0.0] * threads
    start = time.monotonic() + 0.5  # (every connection made before any set)

    def run(index: int) -> None:
        store = stores[index]
        keys = [f"autoannot/count/{first_key + index}", f"autoannot/progress/{first_key + index}"]
        values = [COUNT, document]
        latencies, count = [], 0
        while time.monotonic() < start:
            time.sleep(0.001)
        end = start + seconds
        while (now := time.monotonic()) < end:
            store.multi_set(keys, values)
            latencies.append(time.monotonic() - now)
            count += 1
        store.get(keys[1])  # (a set has no reply: the server has served them all once this has)
        results[index] = (count, latencies)
        finished[index] = time.monotonic() - start

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.put((sum(c for c, _ in results), max(finished),
             [x for _, lat in results for x in lat[::10]]))


def measure(processes: int, threads: int, seconds: float, ranks: int) -> dict:
    import torch
    import torch.distributed as dist

    document = real_document()
    port = _free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=60))
    context = mp.get_context("spawn")
    out: mp.Queue = context.Queue()
    clients = [context.Process(target=_client, args=(port, p * threads, threads, seconds,
                                                      document, out))
               for p in range(processes)]
    for c in clients:
        c.start()
    got = [out.get(timeout=seconds + 120) for _ in clients]
    for c in clients:
        c.join()
    sets = sum(n for n, _, _ in got)
    latencies = sorted(x for _, _, lat in got for x in lat)
    served = sets / max(elapsed for _, elapsed, _ in got)  # (until the server had them all)
    # the watcher's reads: every rank's count, and every rank's document (set first)
    reads = {}
    for kind, value in (("counts", COUNT), ("documents", document)):
        keys = [f"autoannot/watch-{kind}/{r}" for r in range(ranks)]
        for start in range(0, ranks, 1024):
            server.multi_set(keys[start:start + 1024], [value] * len(keys[start:start + 1024]))
        took = []
        for _ in range(5):
            began = time.perf_counter()
            values = server.multi_get(keys)
            took.append(time.perf_counter() - began)
        reads[kind] = {"seconds": round(statistics.median(took), 4),
                       "bytes": sum(len(v) for v in values)}
    return {"torch": torch.__version__, "cpus": os.cpu_count(), "document_bytes": len(document),
            "count_bytes": len(COUNT), "clients": processes * threads, "processes": processes,
            "seconds": seconds, "served_multi_sets_per_s": round(served), "multi_set_call_ms": {
                "p50": round(1e3 * latencies[len(latencies) // 2], 3),
                "p99": round(1e3 * latencies[int(len(latencies) * 0.99)], 3)},
            "watcher_reads": {"ranks": ranks, **reads}}


def at_scale(measured: dict, ranks: int = RANKS_AT_SCALE) -> dict:
    """Requests and bytes a second for ``ranks`` ranks at each interval, and the shortest
    interval that keeps the server under a quarter of what it served here with the watcher's
    read of the counts (scaled by ranks) under half an interval; the read of every document
    (at a hang, and for stragglers) scaled likewise."""
    served = measured["served_multi_sets_per_s"]
    doc, count = measured["document_bytes"], measured["count_bytes"]
    reads = measured["watcher_reads"]
    scale = ranks / reads["ranks"]
    counts_s = reads["counts"]["seconds"] * scale
    documents_s = reads["documents"]["seconds"] * scale
    rows = []
    for interval in (1, 2, 5, 10, 20, 30, 60):
        sets = ranks / interval
        rows.append({"interval_s": interval, "multi_sets_per_s": round(sets),
                     "bytes_in_per_s": round(sets * (doc + count)),
                     "watcher_counts_bytes_per_s": round(ranks * count / interval),
                     "share_of_served": round(sets / served, 3),
                     "counts_read_share": round(counts_s / interval, 3),
                     "straggler_look_every_s": round(max(interval, 4 * documents_s), 1)})
    fits = [r["interval_s"] for r in rows
            if r["share_of_served"] <= 0.25 and r["counts_read_share"] <= 0.5]
    return {"ranks": ranks, "counts_read_s": round(counts_s, 2),
            "documents_read_s": round(documents_s, 2),
            "documents_read_bytes": round(ranks * doc), "by_interval": rows,
            "shortest_interval_s": fits[0] if fits else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=8, help="connections a process")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--ranks", type=int, default=8192, help="keys the watcher reads")
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args(argv)
    measured = measure(args.processes, args.threads, args.seconds, args.ranks)
    result = {"measured": measured, "at_65536_ranks": at_scale(measured)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.output is not None:
        if args.output.exists():
            print(f"{args.output}: exists; not written over", file=sys.stderr)
            return 1
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

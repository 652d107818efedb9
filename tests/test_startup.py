"""AUTOANNOT=1: processes are instrumented with no import of autoannot in their code, and the
start-up hook imports no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from harness import clean_env

import autoannot
from autoannot.cli import HOOK_DIR

PROGRAM = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    def worker(rank, world, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        t = torch.ones(4)
        dist.all_reduce(t)
        dist.broadcast(t, src=1)
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        assert "autoannot" not in sys.modules or os.environ.get("AUTOANNOT") == "1"
        mp.spawn(worker, args=(2, int(sys.argv[1])), nprocs=2)
""")


def run_python(args, env_extra, tmp_path, **kw) -> subprocess.CompletedProcess:
    env = clean_env()
    env.update(env_extra)
    return subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=240, **kw)


def test_autoannot_env_instruments_spawned_workers(tmp_path: Path) -> None:
    from harness import free_port

    (tmp_path / "program.py").write_text(PROGRAM)
    record = tmp_path / "records" / "rank{rank}.jsonl"
    done = run_python(["program.py", str(free_port())],
                      {"AUTOANNOT": "1", "AUTOANNOT_RECORD": str(record)}, tmp_path)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        lines = [json.loads(x) for x in
                 (tmp_path / "records" / f"rank{rank}.jsonl").read_text().splitlines()]
        assert [x["api"] for x in lines] == ["all_reduce", "broadcast", "barrier"]
        assert lines[0]["annotation"]["Collective name"] == "allreduce"
        assert lines[1]["param_comms"]["Rank"] == 1
        assert lines[0]["call_site"].endswith("program.py:9")
        assert lines[1]["call_site"].endswith("program.py:10")


def test_without_autoannot_nothing_is_instrumented(tmp_path: Path) -> None:
    code = ("import sys, torch.distributed as d; "
            "print('autoannot' in sys.modules, type(d.all_reduce).__name__)")
    done = run_python(["-c", code], {}, tmp_path)
    assert done.stdout.split() == ["False", "function"], done.stderr


def test_hook_imports_no_torch(tmp_path: Path) -> None:
    done = run_python(["-X", "importtime", "-c", "pass"], {"AUTOANNOT": "1"}, tmp_path)
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")]
    assert "autoannot._startup" in imported
    assert not [m for m in imported if m == "torch" or m.startswith(("torch.", "wrapt"))]


def test_post_import_hook_patches_when_torch_distributed_arrives(tmp_path: Path) -> None:
    code = ("import sys, autoannot; autoannot.enable(); assert 'torch' not in sys.modules; "
            "import torch.distributed as d, wrapt; print(type(d.all_reduce).__name__, "
            "d.all_reduce.__wrapped__ is d.distributed_c10d.all_reduce.__wrapped__)")
    done = run_python(["-c", code], {}, tmp_path)
    assert done.stdout.split() == ["CollectiveProxy", "True"], done.stderr


def test_sitecustomize_hook_chains_an_existing_one(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins; builtins.THEIRS_RAN = True\n")
    code = ("import builtins, autoannot; "
            "print(getattr(builtins, 'THEIRS_RAN', False), autoannot.is_enabled())")
    env = {"AUTOANNOT": "1", "PYTHONPATH": os.pathsep.join([str(HOOK_DIR), str(theirs)])}
    done = run_python(["-c", code], env, tmp_path)
    assert done.stdout.split() == ["True", "True"], done.stderr


def test_cli_run_sets_the_environment(tmp_path: Path) -> None:
    code = "import os, autoannot; print(os.environ['AUTOANNOT'], autoannot.is_enabled())"
    done = run_python(["-m", "autoannot.cli", "run", sys.executable, "-c", code], {}, tmp_path)
    assert done.stdout.split() == ["1", "True"], done.stderr
    bad = run_python(["-m", "autoannot.cli", "run", "no-such-program-xyz"], {}, tmp_path)
    assert bad.returncode == 127 and "cannot run" in bad.stderr
    assert run_python(["-m", "autoannot.cli"], {}, tmp_path).returncode == 2
    assert autoannot.__version__ in run_python(["-m", "autoannot.cli", "--version"], {},
                                               tmp_path).stdout


NESTED = textwrap.dedent("""
    import os, subprocess, sys
    import torch, torch.distributed as dist
    from autoannot.agent.instrumentation import INSTRUMENTATION as AGENT

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    dist.all_reduce(torch.ones(2))
    wrapped = dist.all_reduce.__wrapped__
    layer = AGENT.layer  # (where torch's groups take hooks: the hooks on the one group)
    kernels = [1] * (layer.registrations if layer is not None else AGENT.hooks.groups_hooked)
    owners = [(id(p.owner), p.name) for p in AGENT.installed() if hasattr(p, "owner")]
    print(os.getpid(), type(wrapped).__name__, len(kernels), len(owners) == len(set(owners)))
    dist.destroy_process_group()
    sys.stdout.flush()
    if len(sys.argv) > 2:  # start the same program again, inheriting AUTOANNOT=1
        subprocess.run([sys.executable, __file__, sys.argv[2]], check=True)
""")


def test_nested_processes_are_each_instrumented_once(tmp_path: Path) -> None:
    """Both start-up hooks present (the .pth and the sitecustomize directory), and a child
    python that inherits AUTOANNOT=1: every process is patched once and records each call
    once."""
    from harness import free_port

    (tmp_path / "nested.py").write_text(NESTED)
    record = tmp_path / "records" / "{pid}.jsonl"
    env = {"AUTOANNOT": "1", "AUTOANNOT_RECORD": str(record), "PYTHONPATH": str(HOOK_DIR)}
    done = run_python(["nested.py", str(free_port()), str(free_port())], env, tmp_path)
    assert done.returncode == 0, done.stderr
    processes = [line.split() for line in done.stdout.splitlines()
                 if not line.startswith("[Gloo]")]  # gloo's own connection log (torch < 2.10)
    assert len(processes) == 2  # the program and its nested copy
    for pid, wrapped, kernels, distinct in processes:
        assert wrapped == "function"  # one proxy over torch's function, not a proxy of one
        assert kernels == "1" and distinct == "True"  # kernels (or hooks) registered once
        lines = (tmp_path / "records" / f"{pid}.jsonl").read_text().splitlines()
        assert [json.loads(x)["api"] for x in lines] == ["all_reduce"]


TORCHRUN_PROGRAM = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.barrier()
    dist.destroy_process_group()
""")


def test_torchrun_workers_are_instrumented(tmp_path: Path) -> None:
    from harness import free_port

    (tmp_path / "job.py").write_text(TORCHRUN_PROGRAM)
    record = tmp_path / "records" / "rank{rank}.jsonl"
    done = run_python(["-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                       "--master-port", str(free_port()), "job.py"],
                      {"AUTOANNOT": "1", "AUTOANNOT_RECORD": str(record)}, tmp_path)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        lines = [json.loads(x) for x in
                 (tmp_path / "records" / f"rank{rank}.jsonl").read_text().splitlines()]
        assert [x["api"] for x in lines] == ["all_reduce", "barrier"]
        assert lines[0]["param_comms"]["Rank"] == rank
        assert lines[0]["call_site"].endswith("job.py:5")


LOOKS_FOR_THE_NATIVE_MODULE = """
import json
import torch.distributed
from autoannot import native
looked = []
real = native.built_path
native.built_path = lambda: looked.append(1) or real()
import autoannot
autoannot.enable()
from autoannot.agent.instrumentation import INSTRUMENTATION
print(json.dumps({"looked": len(looked), "proxies": len(INSTRUMENTATION.proxies._entries)}))
"""


def test_enable_looks_for_the_native_module_once_not_once_a_proxy(tmp_path: Path) -> None:
    """Each proxy's wrapper asks for the native module (its C wrapper, where built): found
    once and kept. A first version asked afresh for each launch's proxy on torch >= 2.14 with
    no build: 22 looks in one ``enable()``, each hashing the module's sources twice."""
    env = {**clean_env(), "AUTOANNOT_NATIVE_DIR": str(tmp_path / "no-build")}
    done = subprocess.run([sys.executable, "-c", LOOKS_FOR_THE_NATIVE_MODULE], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["proxies"] >= 10 and said["looked"] <= 2, said

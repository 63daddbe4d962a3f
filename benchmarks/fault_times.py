"""How long each injected fault takes to end the job, and how: docs/reliability.md's table.

    python benchmarks/fault_times.py [--timeout 3]

Runs each fault of ``tests/parallel/faults`` once (jobs under plain mpiexec and the launcher,
the virtual cluster, checkpoints, the app's start-up checks) with ``NEEDLE_COMM_TIMEOUT`` set to
``--timeout`` seconds, and prints a Markdown table: the fault, the first line that names it
(or the outcome), and the wall-clock seconds until every rank had ended.
"""
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Tuple

import numpy as np

from needle import cli

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "parallel" / "faults" / "worker_early_death.py")


def job(cmd: List[str], timeout: float) -> Tuple[str, float]:
    """Run a job; (its most telling stderr line, seconds)."""
    env = dict(os.environ, NEEDLE_COMM_TIMEOUT=str(timeout),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    start = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env,
                         stdin=subprocess.DEVNULL, timeout=10 * timeout + 60)
    took = time.monotonic() - start
    lines = [x.strip() for x in res.stderr.splitlines() if x.strip()]
    keys = ("needle.parallel.launch: rank", "needle.parallel", "Error:", "Abort(",
            "error:", "KILLED", "Killed")
    told = next((x for k in keys for x in lines if k in x), f"exit status {res.returncode}")
    return f"exit {res.returncode}: {told[:150]}", took


def in_process(fn: Callable[[], str]) -> Tuple[str, float]:
    """Time a fault that raises in this process; (the error, seconds)."""
    start = time.monotonic()
    try:
        fn()
        told = "no error"
    except Exception as err:  # noqa: BLE001 (reported)
        told = f"{type(err).__name__}: {str(err).splitlines()[0][:150]}"
    return told, time.monotonic() - start


def _virtual_poll(timeout: float) -> None:
    from needle.parallel import virtual

    def fn(comm):
        if comm.rank == 0:
            work = comm.allreduce_async(np.ones(3))
            while not work.test():
                pass
        else:
            comm.recv(source=0, tag=9)
    virtual.run(2, fn, timeout=timeout)


def _virtual_both_poll(timeout: float) -> None:
    from needle.parallel import virtual

    def fn(comm):
        work = comm.irecv(1 - comm.rank, tag=4)  # never sent
        while not work.test():
            pass
    virtual.run(2, fn, timeout=timeout)


def _virtual_tp() -> None:
    from needle.parallel import virtual
    from needle.parallel.tensor_parallel.transformer import ParallelTransformerBlock
    virtual.run(2, lambda comm: ParallelTransformerBlock(8, 2, 4, 16, comm,
                                                         sequence_parallel=comm.rank == 1))


def _virtual_mesh() -> None:
    from needle.parallel import virtual
    from needle.parallel.mesh import ProcessMesh
    virtual.run(2, lambda comm: ProcessMesh(comm, dp=2 - comm.rank, tp=1 + comm.rank))


def _virtual_root() -> None:
    from needle.parallel import virtual
    virtual.run(2, lambda comm: comm.broadcast(np.ones(3), root=5))


def _virtual_ddp() -> None:
    from needle import nn
    from needle.parallel import DistributedDataParallel, virtual
    virtual.run(2, lambda comm: DistributedDataParallel(
        nn.Linear(4, 4), comm, bucket_cap_mb=1.0 + comm.rank))


def _virtual_no_sync() -> None:
    import needle as ndl
    from needle import nn
    from needle.parallel import DistributedDataParallel, virtual

    def fn(comm):  # rank 0: two backward passes under no_sync(), then a synced one
        ddp = DistributedDataParallel(nn.Linear(4, 4), comm)
        x = ndl.Tensor(np.ones((2, 4), dtype="float32"))
        for step in range(3):
            with ddp.no_sync() if comm.rank == 0 and step < 2 else contextlib.nullcontext():
                ddp(x).sum().backward()
    virtual.run(2, fn)


def _corrupt_checkpoint() -> None:
    import needle as ndl
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.ndl"
        ndl.save({"w": np.ones(10_000)}, path)
        raw = bytearray(path.read_bytes())
        raw[-4096:] = bytes(4096)
        path.write_bytes(bytes(raw))
        ndl.load(path)


def main() -> None:
    ap = cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=cli.positive_type(), default=3.0)
    t = ap.parse_args().timeout
    from needle.parallel import mpiexec as mpiexec_tool
    mpiexec = mpiexec_tool.find()
    py, launch = sys.executable, [sys.executable, "-m", "needle.parallel.launch", "-n", "2"]
    rows = []
    for mode in ("raise", "exit0", "exit3", "kill"):
        for when in ("before", "after"):
            what = {"before": "before `communicator.create()`", "after": "mid-job"}[when]
            rows.append((f"mpiexec: rank 1 {mode} {what}",
                         job([mpiexec, "-n", "2", py, WORKER, mode, when], t)))
    rows.append(("mpiexec: rank 1 exit3 while rank 0 splits the communicator",
                 job([mpiexec, "-n", "2", py, WORKER, "exit3", "split"], t)))
    rows.append(("mpiexec: rank 1 exit0 after its last call (rank 0 finishes)",
                 job([mpiexec, "-n", "2", py, WORKER, "exit0", "end"], t)))
    poll = str(ROOT / "tests" / "parallel" / "faults" / "worker_poll_after_exit.py")
    rows.append(("mpiexec: rank 0 polls `Work.test()` after rank 1 returned",
                 job([mpiexec, "-n", "2", py, poll], t)))
    for mode in ("kill", "exit0", "exit3", "kill-late-seen", "kill-starved"):
        rows.append((f"launcher: rank 1 {mode} mid-job", job(launch + [WORKER, mode, "after"], t)))
    ps_worker = str(ROOT / "tests" / "parallel" / "faults" / "worker_ps_stuck.py")
    rows.append(("mpiexec: ASP parameter server, worker rank 2 stuck after 2 steps",
                 job([mpiexec, "-n", "3", py, ps_worker], t)))
    rows.append(("virtual: rank 0 polls `Work.test()`, rank 1 times out",
                 in_process(lambda: _virtual_poll(t))))
    rows.append(("virtual: both ranks poll `Work.test()` for each other",
                 in_process(lambda: _virtual_both_poll(t))))
    rows.append(("virtual: `broadcast(root=5)` on 2 ranks", in_process(_virtual_root)))
    rows.append(("virtual: TP block, `sequence_parallel` differs", in_process(_virtual_tp)))
    rows.append(("virtual: `ProcessMesh` (dp, tp) differs", in_process(_virtual_mesh)))
    rows.append(("virtual: DDP bucket_cap_mb differs", in_process(_virtual_ddp)))
    rows.append(("virtual: DDP, rank 0 accumulates 2 passes under `no_sync()`, rank 1 syncs each",
                 in_process(_virtual_no_sync)))
    rows.append(("`ndl.load` of a file with 4 KiB zeroed", in_process(_corrupt_checkpoint)))
    rows.append(("`train_parallel --steps 0`",
                 job([py, "-m", "apps.train_parallel", "--strategy", "ddp", "--steps", "0"], t)))
    rows.append(("`needle.estimate --layers 1000000`",
                 job([py, "-m", "needle.estimate", "--layers", "1000000"], t)))
    print(f"NEEDLE_COMM_TIMEOUT={t:g}\n")
    print("| fault | what happens | seconds |\n|---|---|---|")
    for fault, (told, took) in rows:
        print(f"| {fault} | {told.replace('|', '/')} | {took:.1f} |")


if __name__ == "__main__":
    main()

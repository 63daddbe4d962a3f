"""Under mpiexec: how ranks that synchronise share the cores (``needle/plan/core_sharing.py``
says why it is measured and turns the seconds written here into a factor).

    mpiexec -n 4 python -m needle.plan.measure.core_sharing out.json

Each rank loops ``chunk(n)`` (n training steps of a small needle MLP: the kind of work, and
working set, of needle's steps; not a model any strategy here runs) then a blocking allreduce
of 64 KiB (the strategies' messages here are 32-131 KB), for several n; rank 0 writes the
per-iteration seconds (the slowest rank's), n = 0 (the allreduce alone) first.
"""
import json
import sys
import time
from typing import Any, Callable

import numpy as np

CHUNKS = (0, 2, 8)  # MLP steps per wait; ~0.6 ms per step on the 2-core VM
MESSAGE = 16384  # float32s: 64 KiB


def _mlp() -> Callable[[int], None]:
    """``chunk(n)``: n forward, backward and Adam steps of a 64-100-100-10 MLP, batch 32."""
    import needle as ndl
    from needle import nn
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(64, 100), nn.ReLU(), nn.Linear(100, 100), nn.ReLU(),
                          nn.Linear(100, 10))
    x = ndl.Tensor(rng.standard_normal((32, 64)).astype(np.float32), requires_grad=False)
    y = ndl.Tensor(rng.integers(0, 10, 32), dtype="int64", requires_grad=False)
    opt = ndl.optim.Adam(model.parameters(), lr=1e-3)

    def chunk(n: int) -> None:
        for _ in range(n):
            loss = nn.SoftmaxLoss()(model(x), y)
            opt.reset_grad()
            loss.backward(create_graph=False)
            opt.step()
    return chunk


def seconds_per_iteration(comm: Any, chunk: Callable[[int], None], n: int) -> float:
    """This rank's mean seconds of ``chunk(n)`` + an allreduce, after a warm-up."""
    buf, iters = np.ones(MESSAGE, np.float32), max(30, 240 // max(n, 1))
    for _ in range(5):
        chunk(n)
        comm.allreduce(buf)
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        chunk(n)
        comm.allreduce(buf)
    return (time.perf_counter() - t0) / iters


def main(path: str) -> None:
    """Measure every chunk size; rank 0 writes the slowest rank's seconds."""
    from needle.parallel import communicator
    comm = communicator.create()
    chunk = _mlp()
    mine = np.array([[seconds_per_iteration(comm, chunk, n) for n in CHUNKS]])
    worst = comm.allgather(mine).max(axis=0)
    if comm.rank == 0:
        with open(path, "w") as f:
            json.dump({"chunks": list(CHUNKS), "seconds": worst.tolist()}, f)


if __name__ == "__main__":
    main(sys.argv[1])

"""How ranks that synchronise share the cores: the slowdown of a compute chunk of ``w``
seconds followed by a wait for every other rank, at p ranks against one rank.

    mpiexec -n 4 python -m needle.plan.core_sharing out.json

Each rank loops ``chunk(n)`` (n training steps of a small needle MLP: the kind of work, and
working set, of needle's steps; not a model any strategy here runs) then a blocking allreduce
of 64 KiB (the strategies' messages here are 32-131 KB), for
several n; rank 0 writes the per-iteration seconds (the slowest rank's), n = 0 (the allreduce
alone) first. Run at 1 rank too: the factor is (T_p(n) - T_p(0)) / (T_1(n) - T_1(0)).

Why measured and not cores / p: beyond the cores, a rank that waits gives its core to its
core-mate, and once its message has come it runs again only when the core-mate's time slice
ends (the scheduler does not preempt a running task for one that yielded); a collective of
several rounds can be caught like that more than once. Measured on the 2-core VM, 4 ranks:
each rank's CPU time per step grew (3.5 ms of needle MLP steps per wait took 4.2-6.0 ms of
CPU per rank) and the wall time was the ranks' CPU time / cores, 2.2-3.4x, not 2x; the
factor grows with the wait's message rounds (NumPy chunks: 8-byte and 64 KiB allreduces, 2
rounds of recursive doubling, 2.0-2.6x; MLP steps: 64 KiB 2.2-2.4x, 128 KiB, a 6-round ring,
2.6-4.1x). The loop is synthetic, never the strategy predicted.
"""
import json
import sys
import time
from typing import Any, Callable, List, Sequence, Tuple

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


def slowdown_curve(one: Sequence[float], many: Sequence[float]) -> List[Tuple[float, float]]:
    """(w, factor) per chunk size: w the one-rank chunk (the allreduce's own time taken
    out), factor how much longer the same chunk takes at p ranks."""
    return [(o - one[0], (m - many[0]) / (o - one[0])) for o, m in zip(one[1:], many[1:])]


def sharing_factor(curve: Sequence[Tuple[float, float]]) -> float:
    """One factor for the machine at p ranks: the median over the chunk sizes."""
    return float(np.median([f for _, f in curve]))


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

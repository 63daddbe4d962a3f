"""The least any collective written in Python over mpi4py pays: the *floor* rows of
bench_collectives.

Each floor runs the messages of one of needle's algorithms (recursive doubling / halving for
p a power of two, the ring, the binomial tree; Thakur, Rabenseifner and Gropp, IJHPCA 2005)
straight on mpi4py: the same ``Irecv``/``Isend`` pairs and one ``Testall`` loop per step, the
same reductions, and nothing else: no argument check, no deadline, no counters or ledger, no
scratch or result copies, no chunking.  Any implementation with the same messages in Python
pays at least this; needle's time minus the floor is what its own Python (the checks and the
bookkeeping) costs, and MPICH's time against the floor shows what a C implementation saves.
Timings only: results are not checked here (tests check needle's algorithms).
"""
import os
from typing import Any, Callable, Dict, List

import numpy as np

OVERSUBSCRIBED = False  # set by the benchmark: more ranks on this node than cores


def _exchange(raw: Any, MPI: Any, recv: np.ndarray, send: np.ndarray, peer: int,
              src: int) -> None:
    _wait(MPI, [raw.Irecv(recv, src, 9), raw.Isend(send, peer, 9)])


def _wait(MPI: Any, reqs: List[Any]) -> None:
    """Poll until done; with more ranks than cores, give the core away after each empty poll
    (a spinning rank would hold the core its peer needs), as needle's MPI transport does."""
    while not MPI.Request.Testall(reqs):
        if OVERSUBSCRIBED:
            os.sched_yield()


def allreduce_floors(raw: Any, MPI: Any, x: np.ndarray, out: np.ndarray
                     ) -> Dict[str, Callable[[], None]]:
    """Recursive doubling (p a power of two) and ring allreduce of ``x`` into ``out``."""
    p, r = raw.Get_size(), raw.Get_rank()
    tmp = np.empty_like(x)
    b = [k * x.size // p for k in range(p + 1)]

    def seg(a: np.ndarray, i: int) -> np.ndarray:
        return a[b[i % p]:b[i % p + 1]]

    def rd() -> None:
        out[...] = x
        mask = 1
        while mask < p:
            _exchange(raw, MPI, tmp, out, r ^ mask, r ^ mask)
            np.add(out, tmp, out=out)
            mask <<= 1

    def ring() -> None:
        right, left = (r + 1) % p, (r - 1) % p
        for s in range(p - 1):  # send what we summed last (x itself at first), add what arrives
            mine = seg(x, r - s) if s == 0 else seg(out, r - s)
            _exchange(raw, MPI, seg(tmp, r - s - 1), mine, right, left)
            np.add(seg(x, r - s - 1), seg(tmp, r - s - 1), out=seg(out, r - s - 1))
        for s in range(p - 1):
            _exchange(raw, MPI, seg(out, r - s), seg(out, r + 1 - s), right, left)
    return _only_pow2(p, {"recursive doubling floor": rd, "ring floor": ring})


def allgather_floors(raw: Any, MPI: Any, part: np.ndarray, out: np.ndarray
                     ) -> Dict[str, Callable[[], None]]:
    """Recursive doubling (p a power of two) and ring allgather of ``part`` into ``out``."""
    p, r, n = raw.Get_size(), raw.Get_rank(), part.size

    def rd() -> None:
        out[r * n:(r + 1) * n] = part
        mask = 1
        while mask < p:
            peer, lo, plo = r ^ mask, (r & -mask) * n, ((r ^ mask) & -mask) * n
            _exchange(raw, MPI, out[plo:plo + mask * n], out[lo:lo + mask * n], peer, peer)
            mask <<= 1

    def ring() -> None:
        out[r * n:(r + 1) * n] = part
        right, left = (r + 1) % p, (r - 1) % p
        for s in range(p - 1):
            i, j = (r - s) % p, (r - s - 1) % p
            _exchange(raw, MPI, out[j * n:(j + 1) * n], out[i * n:(i + 1) * n], right, left)
    return _only_pow2(p, {"recursive doubling floor": rd, "ring floor": ring})


def reduce_scatter_floors(raw: Any, MPI: Any, x: np.ndarray, res: np.ndarray
                          ) -> Dict[str, Callable[[], None]]:
    """Recursive halving (p a power of two) and ring reduce-scatter of ``x`` into ``res``."""
    p, r, m = raw.Get_size(), raw.Get_rank(), res.size
    acc, tmp = np.empty_like(x), np.empty_like(x)

    def rh() -> None:
        src, d = x, p // 2
        while d >= 1:
            lo = r & -(2 * d)
            keep, give = (lo, lo + d) if r & d == 0 else (lo + d, lo)
            k, g = slice(keep * m, (keep + d) * m), slice(give * m, (give + d) * m)
            _exchange(raw, MPI, tmp[k], src[g], r ^ d, r ^ d)
            np.add(src[k], tmp[k], out=res if d == 1 else acc[k])
            src, d = acc, d // 2

    def ring() -> None:
        right, left = (r + 1) % p, (r - 1) % p
        for s in range(p - 1):
            i, j = (r - s - 1) % p, (r - s - 2) % p
            send = x[i * m:(i + 1) * m] if s == 0 else acc[i * m:(i + 1) * m]
            _exchange(raw, MPI, tmp[j * m:(j + 1) * m], send, right, left)
            dst = res if s == p - 2 else acc[j * m:(j + 1) * m]
            np.add(x[j * m:(j + 1) * m], tmp[j * m:(j + 1) * m], out=dst)
    return _only_pow2(p, {"recursive halving floor": rh, "ring floor": ring})


def broadcast_floor(raw: Any, MPI: Any, buf: np.ndarray) -> Dict[str, Callable[[], None]]:
    """Binomial-tree broadcast of ``buf`` from rank 0, one message per edge."""
    p, r = raw.Get_size(), raw.Get_rank()

    def tree() -> None:
        mask = 1
        while mask < p and not r & mask:
            mask <<= 1
        if r:  # receive from the parent, then send to the children below ``mask``
            _wait(MPI, [raw.Irecv(buf, r - mask, 9)])
        reqs: List[Any] = []
        mask >>= 1
        while mask > 0:
            if r + mask < p:
                reqs.append(raw.Isend(buf, r + mask, 9))
            mask >>= 1
        _wait(MPI, reqs)
    return {"binomial floor": tree}


def _only_pow2(p: int, floors: Dict[str, Callable[[], None]]) -> Dict[str, Callable[[], None]]:
    """The floors that apply at p ranks (the first needs a power of two)."""
    names = list(floors)
    return floors if p & (p - 1) == 0 else {names[1]: floors[names[1]]}

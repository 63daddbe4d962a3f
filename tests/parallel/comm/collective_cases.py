"""Every collective against the pure references, on one rank of MPI or of the virtual cluster.

``check_all(comm, quick)`` runs on every rank (``mpi_helpers.run_ranks``).  Every rank builds the
inputs of *all* ranks from (seed, rank), so it can compute the pure-function reference
(needle.parallel.comm.algorithms.reference) for everyone locally and compare its own result
exactly; under MPI results are also compared with MPI's native collectives.  It returns the
number of checks and a digest of every result's bytes, so the two backends can be compared
bit for bit.
"""
import hashlib
import itertools

import numpy as np

from needle.parallel import communicator
from needle.parallel.comm.algorithms import reference as ring
from needle.parallel.comm.transport.mpi import MPITransport

DTYPES = ["float32", "float64", "float16", "int32", "int64", "bool"]
NATIVE_OPS = ["sum", "prod", "max", "min"]


class Digest:
    """A running hash of every result a rank got."""

    def __init__(self) -> None:
        self.h = hashlib.blake2b(digest_size=16)

    def add(self, a: np.ndarray) -> np.ndarray:
        self.h.update(str((a.dtype, a.shape)).encode())
        self.h.update(np.ascontiguousarray(a).tobytes())
        return a


def make(seed: int, rank: int, shape: tuple, dtype: str) -> np.ndarray:
    """Rank ``rank``'s input: random values, small integers so products stay exact-ish."""
    rng = np.random.default_rng([seed, rank])
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        return rng.integers(-3, 4, size=shape).astype(dtype)
    return (rng.random(shape) + 0.5).astype(dtype)


def same(a: np.ndarray, b: np.ndarray, what: str) -> None:
    """Exact equality of value, shape and dtype (NaN-free inputs)."""
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{a.shape} vs " \
                                                      f"{b.dtype}{b.shape}"
    assert np.array_equal(a, b), f"{what}: values differ\n{a}\n{b}"


def close(a: np.ndarray, b: np.ndarray, what: str) -> None:
    """Equality up to floating point reassociation (native MPI sums in its own order)."""
    if a.dtype.kind == "f":
        assert np.allclose(a, b, rtol=1e-2 if a.dtype == np.float16 else 1e-5), what
    else:
        assert np.array_equal(a, b), what


def native_allreduce(comm: communicator.Communicator, x: np.ndarray, op: str) -> np.ndarray:
    """MPI's own allreduce on the communicator's MPI communicator."""
    from mpi4py import MPI

    out = np.empty_like(x)
    mpi_op = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[op]
    comm.transport.comm.Allreduce(x, out, op=mpi_op)
    return out


def check_all(comm: communicator.Communicator, quick: bool = False) -> tuple:
    """Every collective, algorithm, dtype and op at several sizes: (checks, digest hex)."""
    small_chunks = communicator.Communicator(comm.transport, timeout=30, chunk_bytes=64)
    is_mpi = isinstance(comm.transport, MPITransport)
    dig = Digest()
    p, r = comm.size, comm.rank
    checks = 0
    lengths = sorted({0, 1, max(p - 1, 0), p + 1, 7 * p + 3, 1000})
    dtypes = DTYPES
    if quick:  # many oversubscribed ranks: fewer cases
        lengths, dtypes = [0, p + 1, 1000], ["float32", "int64"]
    seed = 0
    for n, dtype in itertools.product(lengths, dtypes):
        ops = ["max", "min", "sum"] if dtype == "bool" else ["sum", "max", "min", "prod", "avg"]
        for op, shape in itertools.product(ops, [(n,), (n, 3)]):
            seed += 1
            xs = [make(seed, q, shape, dtype) for q in range(p)]
            for c, algo in itertools.product([comm, small_chunks], ["ring", "recursive_doubling",
                                                                     "auto"]):
                got = dig.add(c.allreduce(xs[r], op=op, algorithm=algo))
                ref_algo = algo if algo != "auto" else ("recursive_doubling" if xs[r].nbytes <=
                                                        comm_small() or p == 1 else "ring")
                fn = (ring.ring_allreduce if ref_algo == "ring"
                      else ring.recursive_doubling_allreduce)
                same(got, fn(xs, op)[r], f"allreduce {algo} {op} {dtype} {shape}")
                checks += 1
            if is_mpi and op in NATIVE_OPS and dtype not in ("float16", "bool"):
                native = native_allreduce(comm, xs[r], op)
                close(comm.allreduce(xs[r], op=op), native, f"native allreduce {op} {dtype}")
                checks += 1
            if op in ("sum", "max", "avg"):
                checks += check_reduce_scatter_and_reduce((comm, small_chunks), xs, op,
                                                          seed % p, dig)
        xs = [make(seed, q, (n, 2), dtype) for q in range(p)]
        for c in (comm, small_chunks):
            same(dig.add(c.allgather(xs[r])), ring.ring_allgather(xs)[r].reshape(p * n, 2),
                 "allgather")
            same(dig.add(c.alltoall(xs[r])), ring.pairwise_alltoall(xs)[r], f"alltoall {dtype}")
            for root in {0, p - 1}:
                same(c.broadcast(xs[r], root=root), xs[root], f"broadcast root {root}")
                buf = xs[r].copy()  # in place (out=buf), as MPI_Bcast
                got = c.broadcast(buf, root=root, out=buf)
                assert got is buf, "broadcast(out=buf) must return buf"
                same(buf, xs[root], f"in-place broadcast root {root}")
            checks += 4
    checks += check_stats(comm) + check_async(comm, dig) + check_misc(comm)
    return checks, dig.h.hexdigest()


def check_reduce_scatter_and_reduce(comms: tuple, xs: list, op: str, root: int,
                                    dig: Digest) -> int:
    """reduce_scatter and reduce (to ``root``) of ``xs`` on each communicator of ``comms``."""
    r = comms[0].rank
    for c in comms:
        same(dig.add(c.reduce_scatter(xs[r], op=op)), reduce_scatter_reference(xs, op)[r],
             f"reduce_scatter {op} {xs[r].dtype} {xs[r].shape}")
        got = c.reduce(xs[r], root=root, op=op)
        if r == root:
            dig.add(got)
            same(got, ring.binomial_reduce(xs, root, op), f"reduce {op} {xs[r].dtype}")
        else:
            assert got is None
    return 2 * len(comms)


def reduce_scatter_reference(xs: list, op: str = "sum") -> list:
    """The reference of the algorithm that ``algorithm="auto"`` picks for these inputs."""
    from needle.parallel.comm.algorithms import select
    algo = select.choose("reduce_scatter", xs[0].nbytes, len(xs))
    if algo == "recursive_halving":
        return ring.recursive_halving_reduce_scatter(xs, op)
    return ring.ring_reduce_scatter(xs, op)


def comm_small() -> int:
    from needle.parallel.comm.algorithms import select
    return select.ALLREDUCE_SMALL


def check_stats(comm: communicator.Communicator) -> int:
    """Ring allreduce sends 2N - |seg(r+1)| - |seg(r+2)| bytes: 2(p-1)/p N when p divides N."""
    p, r = comm.size, comm.rank
    for n in (12 * p * 1024, 12 * p * 1024 + p - 1):
        comm.reset_stats()
        x = np.ones(n, dtype=np.float32)
        comm.allreduce(x, algorithm="ring")
        st = comm.stats["allreduce"]
        b = ring.chunk_bounds(n, p)
        seg = [(b[i + 1] - b[i]) * 4 for i in range(p)]
        expect = 0 if p == 1 else 2 * x.nbytes - seg[(r + 1) % p] - seg[(r + 2) % p]
        assert st["bytes_sent"] == expect, (st, expect)
        assert st["bytes_recv"] == (0 if p == 1 else 2 * x.nbytes - seg[r] - seg[(r + 1) % p])
        if n % p == 0:
            assert st["bytes_sent"] * p == 2 * (p - 1) * x.nbytes
        assert st["calls"] == 1
    return 2


def check_async(comm: communicator.Communicator, dig: Digest) -> int:
    """Several nonblocking collectives in flight at once, finished in reverse order."""
    p, r = comm.size, comm.rank
    xs = [make(99, q, (5000,), "float64") for q in range(p)]
    works = [comm.allreduce_async(xs[r], algorithm="ring"), comm.allgather_async(xs[r]),
             comm.reduce_scatter_async(xs[r]), comm.allreduce_async(xs[r][:10]),
             comm.broadcast_async(xs[r], root=p - 1), comm.alltoall_async(xs[r]),
             comm.reduce_async(xs[r], root=0)]
    works[1].test()
    got = [w.wait() for w in reversed(works)][::-1]
    for g in got:
        if g is not None:
            dig.add(g)
    same(got[0], ring.ring_allreduce(xs)[r], "async allreduce")
    same(got[1], ring.ring_allgather(xs)[r], "async allgather")
    same(got[2], reduce_scatter_reference(xs)[r], "async reduce_scatter")
    same(got[3], ring.recursive_doubling_allreduce([x[:10] for x in xs])[r], "async small")
    same(got[4], xs[p - 1], "async broadcast")
    same(got[5], ring.pairwise_alltoall(xs)[r], "async alltoall")
    assert all(w.is_completed() for w in works)
    return 6


def check_misc(comm: communicator.Communicator) -> int:
    """split, barrier, scalars, non-contiguous input and ``out=``."""
    p, r = comm.size, comm.rank
    sub = comm.split(r % 2, key=-r)  # reversed rank order inside each half
    members = [q for q in range(p) if q % 2 == r % 2]
    assert sub.size == len(members) and sub.rank == len(members) - 1 - members.index(r)
    got = sub.allreduce(np.array([r], dtype=np.int64))
    assert got[0] == sum(members), (got, members)
    comm.barrier()
    scalar = comm.allreduce(np.float64(r + 1))
    assert scalar.shape == () and scalar == p * (p + 1) / 2
    assert comm.allgather(np.int32(r)).tolist() == list(range(p))
    xt = np.arange(12.0).reshape(3, 4).T * (r + 1)  # non-contiguous
    same(comm.allreduce(xt), np.arange(12.0).reshape(3, 4).T * (p * (p + 1) / 2), "transposed")
    out = np.empty(7)
    assert comm.allreduce(np.ones(7), out=out) is out and np.all(out == p)
    return 5


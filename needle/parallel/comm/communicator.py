"""The communicator: the object every distributed feature of needle is handed explicitly.

    from needle.parallel import communicator
    comm = communicator.create()              # MPI.COMM_WORLD, or create(some_mpi_comm)
    total = comm.allreduce(grad, op="sum")    # numpy array, needle NDArray or Tensor
    work = comm.allreduce_async(grad); ...; total = work.wait()

Each call (1) describes its arguments and checks that all ranks agree (``metadata.py``),
(2) runs one algorithm generator (``ring.py``, ``latency_bound.py``) over point-to-point
messages, chosen by size (``select.py``) unless ``algorithm=`` names one, and (3) waits with a
deadline (``progress.py``; ``NEEDLE_COMM_TIMEOUT`` seconds, default 60).  MPI's own collectives
are never used here; they are only the reference in tests and benchmarks.

Conventions: allgather concatenates along axis 0 in rank order (all ranks pass the same shape);
reduce_scatter gives rank r chunk r of p near-equal axis-0 chunks (the first ``n % p`` chunks
one row longer, like ``np.array_split``); alltoall sends axis-0 chunk j to rank j.  ``op="avg"``
is the sum divided by p, floor-divided for integer dtypes and rejected for bool.
"""
import os
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from . import metadata
from .convert import to_numpy
from .faults import install_abort_hook
from .latency_bound import (
    RecursiveDoublingBuffers,
    binomial_broadcast,
    binomial_reduce,
    pairwise_alltoall,
    recursive_doubling_allreduce,
)
from .progress import Algorithm, Channel, Stat, Work, drive, mpi, new_stat
from .reference import UFUNCS, chunk_bounds, finish_avg
from .ring import DEPTH, ring_allgather, ring_allreduce, ring_reduce_scatter_full
from .select import choose


class Communicator:
    """A group of ranks with collectives written on MPI point-to-point messages."""

    def __init__(self, mpi_comm: Any, timeout: Optional[float] = None,
                 chunk_bytes: Optional[int] = None) -> None:
        self._comm = mpi_comm.Dup()  # a private context: user messages never match ours
        self.rank: int = self._comm.Get_rank()
        self.size: int = self._comm.Get_size()
        env = os.environ.get("NEEDLE_COMM_TIMEOUT", "60")
        self.timeout = float(env if timeout is None else timeout)
        self.chunk_bytes = int(chunk_bytes or os.environ.get("NEEDLE_RING_CHUNK", 1 << 20))
        self.stats: Dict[str, Stat] = {}
        self._seq = 0
        self._tags = max(1, min(self._comm.Get_attr(mpi().TAG_UB) or 32767, 1 << 29) // 4)
        self._pool: List[np.ndarray] = []
        self._rd_cache: Dict[tuple, RecursiveDoublingBuffers] = {}
        self.spin_polls = _spin_polls(self._comm)

    # -- the collectives ---------------------------------------------------------------------
    def allreduce(self, a: Any, op: str = "sum", algorithm: str = "auto",
                  out: Optional[np.ndarray] = None) -> Any:
        """Elementwise reduction over all ranks; every rank gets the result."""
        return self.allreduce_async(a, op, algorithm, out, _block=True)

    def allreduce_async(self, a: Any, op: str = "sum", algorithm: str = "auto",
                        out: Optional[np.ndarray] = None, _block: bool = False) -> Any:
        """Nonblocking ``allreduce``: returns a ``Work``; ``wait()`` gives the result."""
        x, restore = to_numpy(a)
        _check_op(op)
        algo = choose("allreduce", x.nbytes, self.size, algorithm)
        desc = ("allreduce", "op", op, "dtype", x.dtype, "shape", x.shape, "algorithm", algo)
        res = _output(out, x.shape, x.dtype)

        def finish(_: Any) -> Any:  # both algorithms leave the sum in ``res``
            return restore(finish_avg(res, self.size) if op == "avg" else res)
        if algo == "ring":
            ws = self._take(DEPTH * self.chunk_bytes)
            items = max(1, self.chunk_bytes // x.itemsize)
            body = lambda ch: ring_allreduce(ch, x.reshape(-1), res.reshape(-1), op, items,
                                             ws[:DEPTH * items * x.itemsize].view(x.dtype))
            return self._run("allreduce", desc, body, finish, _block, [ws])
        return self._run_fused(x, res, op, desc, finish, _block)

    def allgather(self, a: Any, algorithm: str = "auto", out: Optional[np.ndarray] = None) -> Any:
        """Rank-order concatenation along axis 0 of every rank's (same-shaped) array."""
        return self.allgather_async(a, algorithm, out, _block=True)

    def allgather_async(self, a: Any, algorithm: str = "auto",
                        out: Optional[np.ndarray] = None, _block: bool = False) -> Any:
        """Nonblocking ``allgather``."""
        x, restore = to_numpy(a)
        x = x.reshape(1) if x.ndim == 0 else x
        algo = choose("allgather", x.nbytes, self.size, algorithm)
        desc = ("allgather", "dtype", x.dtype, "shape", x.shape, "algorithm", algo)
        res = _output(out, (self.size * x.shape[0],) + x.shape[1:], x.dtype)
        items = max(1, self.chunk_bytes // x.itemsize)
        body = lambda ch: ring_allgather(ch, x.reshape(-1), res.reshape(-1), items)
        return self._run("allgather", desc, body, lambda r: restore(res), _block)

    def reduce_scatter(self, a: Any, op: str = "sum", algorithm: str = "auto",
                       out: Optional[np.ndarray] = None) -> Any:
        """Reduce over ranks; rank r gets chunk r (of p near-equal axis-0 chunks)."""
        return self.reduce_scatter_async(a, op, algorithm, out, _block=True)

    def reduce_scatter_async(self, a: Any, op: str = "sum", algorithm: str = "auto",
                             out: Optional[np.ndarray] = None, _block: bool = False) -> Any:
        """Nonblocking ``reduce_scatter``."""
        x, restore = to_numpy(a)
        _check_op(op)
        if x.ndim == 0:
            raise ValueError("reduce_scatter needs an array with at least one axis")
        algo = choose("reduce_scatter", x.nbytes, self.size, algorithm)
        desc = ("reduce_scatter", "op", op, "dtype", x.dtype, "shape", x.shape,
                "algorithm", algo)
        row = int(np.prod(x.shape[1:], dtype=np.int64))
        b = [k * row for k in chunk_bounds(x.shape[0], self.size)]
        rows = chunk_bounds(x.shape[0], self.size)
        mine = rows[self.rank + 1] - rows[self.rank]
        res = _output(out, (mine,) + x.shape[1:], x.dtype)
        items = max(1, self.chunk_bytes // x.itemsize)
        # Partial sums passing through (only p - 2 segments of them are ever used).
        acc_buf, ws = self._take(x.nbytes), self._take(DEPTH * self.chunk_bytes)
        acc = acc_buf[:x.nbytes].view(x.dtype)
        tmp = ws[:DEPTH * items * x.itemsize].view(x.dtype)
        body = lambda ch: ring_reduce_scatter_full(ch, x.reshape(-1), acc, b, op, items, tmp,
                                                   res.reshape(-1))

        def finish(_: np.ndarray) -> Any:
            return restore(finish_avg(res, self.size) if op == "avg" else res)
        return self._run("reduce_scatter", desc, body, finish, _block, [acc_buf, ws])

    def broadcast(self, a: Any, root: int = 0, algorithm: str = "auto",
                  out: Optional[np.ndarray] = None) -> Any:
        """Every rank gets root's array (others pass an array of the same shape and dtype).

        ``out=a`` (a numpy array) broadcasts in place, like ``MPI_Bcast``: no copy on the root.
        """
        return self.broadcast_async(a, root, algorithm, out, _block=True)

    def broadcast_async(self, a: Any, root: int = 0, algorithm: str = "auto",
                        out: Optional[np.ndarray] = None, _block: bool = False) -> Any:
        """Nonblocking ``broadcast``."""
        x, restore = to_numpy(a)
        algo = choose("broadcast", x.nbytes, self.size, algorithm)
        desc = ("broadcast", "root", root, "dtype", x.dtype, "shape", x.shape,
                "algorithm", algo)
        res = _output(out, x.shape, x.dtype)
        if self.rank == root and res is not x:
            res[...] = x
        items = max(1, self.chunk_bytes // x.itemsize)
        body = lambda ch: binomial_broadcast(ch, res.reshape(-1), root, items)
        return self._run("broadcast", desc, body, lambda r: restore(res), _block)

    def reduce(self, a: Any, root: int = 0, op: str = "sum", algorithm: str = "auto") -> Any:
        """Reduction over ranks delivered to ``root``; other ranks get None."""
        return self.reduce_async(a, root, op, algorithm, _block=True)

    def reduce_async(self, a: Any, root: int = 0, op: str = "sum", algorithm: str = "auto",
                     _block: bool = False) -> Any:
        """Nonblocking ``reduce``."""
        x, restore = to_numpy(a)
        _check_op(op)
        algo = choose("reduce", x.nbytes, self.size, algorithm)
        desc = ("reduce", "root", root, "op", op, "dtype", x.dtype, "shape", x.shape,
                "algorithm", algo)
        res = np.empty_like(x)
        items = max(1, self.chunk_bytes // x.itemsize)
        ws = self._take(items * x.itemsize)
        body = lambda ch: binomial_reduce(ch, x.reshape(-1), res.reshape(-1), root, op, items,
                                          ws[:items * x.itemsize].view(x.dtype))

        def finish(_: np.ndarray) -> Any:
            if self.rank != root:
                return None
            return restore(finish_avg(res, self.size) if op == "avg" else res)
        return self._run("reduce", desc, body, finish, _block, [ws])

    def alltoall(self, a: Any, algorithm: str = "auto") -> Any:
        """Axis-0 chunk j goes to rank j; the chunks received are concatenated in rank order."""
        return self.alltoall_async(a, algorithm, _block=True)

    def alltoall_async(self, a: Any, algorithm: str = "auto", _block: bool = False) -> Any:
        """Nonblocking ``alltoall``."""
        x, restore = to_numpy(a)
        if x.ndim == 0:
            raise ValueError("alltoall needs an array with at least one axis")
        algo = choose("alltoall", x.nbytes, self.size, algorithm)
        desc = ("alltoall", "dtype", x.dtype, "shape", x.shape, "algorithm", algo)
        b = chunk_bounds(x.shape[0], self.size)
        row = int(np.prod(x.shape[1:], dtype=np.int64))
        res = np.empty((self.size * (b[self.rank + 1] - b[self.rank]),) + x.shape[1:], x.dtype)
        body = lambda ch: pairwise_alltoall(ch, x.reshape(-1), res.reshape(-1), x.shape[0], row)
        return self._run("alltoall", desc, body, lambda r: restore(res), _block)

    def barrier(self) -> None:
        """Return only once every rank has entered the barrier."""
        self._run("barrier", ("barrier",), lambda ch: _nothing(), lambda r: None, True)

    def split(self, color: int, key: int = 0) -> "Communicator":
        """Sub-communicators of the ranks with equal ``color``, ordered by ``key``."""
        return Communicator(self._comm.Split(color, key), self.timeout, self.chunk_bytes)

    def abort(self, code: int = 1) -> None:
        """Terminate every rank of the job (``MPI_Abort``)."""
        self._comm.Abort(code)

    def reset_stats(self) -> None:
        """Forget the byte and call counters."""
        self.stats.clear()

    # -- plumbing ----------------------------------------------------------------------------
    def _tag(self) -> int:
        self._seq += 1
        return ((self._seq - 1) % self._tags) * 4

    def _describer(self, name: str, chans: List[Channel]) -> Callable[[], str]:
        seq = self._seq

        def describe() -> str:
            peers = sorted({q for c in chans for q in c.peers[-4:]})
            return (f"needle.parallel: {name} (call #{seq}) on rank {self.rank} of {self.size} "
                    f"did not finish within {self.timeout:g} s (NEEDLE_COMM_TIMEOUT); waiting "
                    f"for ranks {peers}")
        return describe

    def _run(self, name: str, desc: tuple, body: Callable[[Channel], Algorithm],
             finish: Callable[[Any], Any], block: bool, bufs: Optional[list] = None) -> Any:
        """Argument check, then ``body``, driven now (block) or returned as a ``Work``."""
        stat = self._stat(name)
        stat["calls"] += 1
        tag = self._tag()
        ctl = self._channel(tag, self._stat("check"))
        ch = self._channel(tag + 1, stat)
        describe = self._describer(name, [ctl, ch])
        gen = self._checked(ctl, tag, desc, body(ch), describe, bufs or [])
        if block:
            return finish(drive(gen, self.timeout, describe, self.spin_polls))
        return Work(gen, self.timeout, describe, finish, self.spin_polls)

    def _checked(self, ctl: Channel, tag: int, desc: tuple, body: Algorithm,
                 describe: Callable[[], str], bufs: list) -> Algorithm:
        try:
            check = self._rd_buffers(0, np.uint8, "min", cached=False)
            metadata.fill_header(check, desc)
            if self.size > 1:
                yield from recursive_doubling_allreduce(ctl, check)
                self._raise_if_mismatch(check, tag, desc, describe)
            return (yield from body)
        finally:
            self._pool.extend(bufs)

    def _run_fused(self, x: np.ndarray, res: np.ndarray, op: str, desc: tuple,
                   finish: Callable[[Any], Any], block: bool) -> Any:
        """Recursive doubling allreduce with the argument check inside its messages.

        A blocking call reuses the buffers of the previous call of the same size, dtype and op
        (small allreduces are latency-bound: allocating and viewing costs as much as sending).
        """
        stat = self._stat("allreduce")
        stat["calls"] += 1
        tag, nbytes = self._tag(), x.nbytes
        bufs = self._rd_buffers(nbytes, x.dtype, op, cached=block)
        bufs.data[...] = x.reshape(-1)
        metadata.fill_header(bufs, desc)
        ch = self._channel(tag, stat, bufs.work.nbytes - nbytes, self._stat("check"))
        describe = self._describer("allreduce", [ch])

        def fused() -> Algorithm:
            yield from recursive_doubling_allreduce(ch, bufs)
            self._raise_if_mismatch(bufs, tag, desc, describe)
            res.reshape(-1)[...] = bufs.data
            return res
        if block:
            return finish(drive(fused(), self.timeout, describe, self.spin_polls))
        return Work(fused(), self.timeout, describe, finish, self.spin_polls)

    def _rd_buffers(self, nbytes: int, dtype: Any, op: str,
                    cached: bool) -> RecursiveDoublingBuffers:
        """Recursive-doubling buffers: the cached set for blocking calls, else a fresh one."""
        if not cached:
            return RecursiveDoublingBuffers(nbytes, dtype, op)
        key = (nbytes, dtype, op)
        bufs = self._rd_cache.get(key)
        if bufs is None:
            if len(self._rd_cache) >= 64:  # bounded: a long run may see many sizes
                self._rd_cache.clear()
            bufs = self._rd_cache[key] = RecursiveDoublingBuffers(nbytes, dtype, op)
        return bufs

    def _raise_if_mismatch(self, bufs: RecursiveDoublingBuffers, tag: int, desc: tuple,
                           describe: Callable[[], str]) -> None:
        if self.size > 1 and not metadata.header_agrees(bufs):
            err_ch = self._channel(tag + 2, self._stat("check"))
            raise metadata.mismatch_error(err_ch, desc, self.timeout, describe)

    def _channel(self, tag: int, stat: Stat, header: int = 0,
                 ctl_stat: Optional[Stat] = None) -> Channel:
        return Channel(self._comm, self.rank, self.size, tag, stat, header, ctl_stat)

    def _stat(self, name: str) -> Stat:
        stat = self.stats.get(name)
        if stat is None:
            stat = self.stats[name] = new_stat()
        return stat

    def _take(self, nbytes: int) -> np.ndarray:
        """A reusable scratch buffer of at least ``nbytes`` (returned to the pool after use)."""
        for i, buf in enumerate(self._pool):
            if buf.nbytes >= nbytes:
                return self._pool.pop(i)
        return np.empty(max(nbytes, 1), dtype=np.uint8)


def create(mpi_comm: Any = None, timeout: Optional[float] = None,
           abort_on_error: bool = True) -> Communicator:
    """A ``Communicator`` over ``mpi_comm`` (default ``MPI.COMM_WORLD``).

    With ``abort_on_error`` an uncaught exception on any rank aborts the whole MPI job (exit code
    1) instead of leaving the other ranks waiting for it.
    """
    MPI = mpi()
    if abort_on_error:
        install_abort_hook()
    return Communicator(MPI.COMM_WORLD if mpi_comm is None else mpi_comm, timeout)


def _spin_polls(mpi_comm: Any) -> int:
    """Empty polls before a waiting rank yields its core: 256, or 0 when this node runs more
    ranks than this process may use cores (oversubscribed); ``NEEDLE_POLLS_BEFORE_YIELD``
    overrides."""
    env = os.environ.get("NEEDLE_POLLS_BEFORE_YIELD")
    if env is not None:
        return int(env)
    local = mpi_comm.Split_type(mpi().COMM_TYPE_SHARED)
    ranks_here = local.Get_size()
    local.Free()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 0 if ranks_here > (cores or 1) else 256


def _check_op(op: str) -> None:
    if op not in UFUNCS:
        raise ValueError(f"unknown op {op!r}; choose from {sorted(UFUNCS)}")


def _output(out: Optional[np.ndarray], shape: tuple, dtype: Any) -> np.ndarray:
    if out is None:
        return np.empty(shape, dtype=dtype)
    if not isinstance(out, np.ndarray) or out.shape != tuple(shape) or out.dtype != dtype \
            or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous numpy array of shape {shape}, {dtype}")
    return out


def _nothing() -> Algorithm:
    return None
    yield  # a generator that finishes at once

"""The communicator: the object every distributed feature of needle is handed explicitly.

    from needle.parallel import communicator
    comm = communicator.create()              # MPI.COMM_WORLD, or create(some_mpi_comm)
    total = comm.allreduce(grad, op="sum")    # numpy array, needle NDArray or Tensor
    work = comm.allreduce_async(grad); ...; total = work.wait()

Each call (1) describes its arguments and checks that all ranks agree (``metadata.py``): the
latency-bound algorithms (recursive doubling allreduce and allgather, recursive halving
reduce-scatter) carry the check's 16-byte header inside their own data messages, the others run
its 16-byte messages together with their first ones; (2) runs one algorithm
generator (``ring.py``, ``latency_bound.py``) over point-to-point messages, chosen by size
(``select.py``) unless ``algorithm=`` names one, (3) waits with a deadline (``progress.py``;
``NEEDLE_COMM_TIMEOUT`` seconds, default 60) and (4) appends a record to ``comm.ledger``
(``ledger.py``; ``label=`` and ``comm.region(name)`` name it). Messages go through a
*transport*: MPI (``transport_mpi.py``) or the threads of the in-process virtual cluster
(``transport_inprocess.py``, ``needle.parallel.virtual.run``); everything above it is the same
code. MPI's own collectives are never used here; they are only the reference in tests and
benchmarks. Point-to-point ``send``/``recv`` are described in ``p2p.py``.

Conventions: allgather concatenates along axis 0 in rank order (all ranks pass the same shape);
reduce_scatter gives rank r chunk r of p near-equal axis-0 chunks (the first ``n % p`` chunks
one row longer, like ``np.array_split``); alltoall sends axis-0 chunk j to rank j.  ``op="avg"``
is the sum divided by p, floor-divided for integer dtypes and rejected for bool.
"""
import math
import os
import time
from functools import lru_cache
from typing import Any, Callable, ContextManager, Dict, List, Optional

import numpy as np

from . import args, metadata, select, threads
from .convert import to_numpy
from .faults import install_abort_hook
from .hierarchical import discover, hierarchical_allreduce, host_name, where
from .latency_bound import (
    AllgatherBuffers,
    RecursiveDoublingBuffers,
    ReduceScatterBuffers,
    binomial_broadcast,
    binomial_reduce,
    pairwise_alltoall,
    recursive_doubling_allgather,
    recursive_doubling_allreduce,
    recursive_halving_reduce_scatter,
)
from .ledger import Ledger, Regions
from .p2p import ANY_SOURCE, ANY_TAG, PointToPoint
from .progress import Algorithm, Channel, Stat, Work, drive, mpi, new_stat
from .reference import chunk_bounds, finish_avg
from .result_pool import ResultPool
from .ring import DEPTH, ring_allgather, ring_allreduce, ring_reduce_scatter_full
from .select import choose
from .transport_mpi import MPITransport

_SPLIT_TAG = 3  # collective calls use tags 4k, 4k+1, 4k+2; split's exchange uses 4k+3


class Communicator(PointToPoint):
    """A group of ranks with collectives and point-to-point messages, over MPI or in-process."""

    ANY_SOURCE = ANY_SOURCE
    ANY_TAG = ANY_TAG
    # False: finish the argument check before the first message (the older order; kept so
    # that the benchmark can measure what overlapping saves).
    overlap_check = True

    def __init__(self, comm: Any, timeout: Optional[float] = None,
                 chunk_bytes: Optional[int] = None) -> None:
        """``comm``: an mpi4py communicator or a transport (``transport_*.py``)."""
        env = os.environ.get("NEEDLE_COMM_TIMEOUT", "60")
        self.timeout = args.check_timeout(env if timeout is None else timeout,
                                          "NEEDLE_COMM_TIMEOUT" if timeout is None else "timeout=")
        base = comm if hasattr(comm, "poll") else MPITransport(comm, timeout=self.timeout)
        # Private contexts: collectives, p2p headers and p2p payloads never match each other's
        # messages, nor the user's own MPI messages.
        self._t, self._hdr_t, self._data_t = base.dup(), base.dup(), base.dup()
        self.transport = self._t
        self.rank: int = self._t.rank
        self.size: int = self._t.size
        if chunk_bytes is None:
            chunk_bytes = args.env_bytes("NEEDLE_RING_CHUNK", 1 << 20, minimum=1)
        elif int(chunk_bytes) < 1:
            raise ValueError(f"chunk_bytes must be at least 1 byte, got {chunk_bytes!r}")
        self.chunk_bytes = int(chunk_bytes)
        self.stats: Dict[str, Stat] = {}
        self.ledger = Ledger()
        self._regions = Regions()
        self._seq = self._p2p_calls = 0
        self._p2p_seq: Dict[int, int] = {}
        self._tags = max(1, self._t.tag_ub // 4)
        self._pool: List[np.ndarray] = []
        self._fused: Dict[tuple, _Fused] = {}  # blocking small calls' buffers, reused
        self._check = RecursiveDoublingBuffers(0, np.uint8, "min", self._t)
        self._check_free: List[RecursiveDoublingBuffers] = []
        chans = [Channel(self._t, 0), Channel(self._t, 1)]
        self._blocking = (chans[0], chans[1], _Describe(self, "", 0, chans))
        self._results = ResultPool()
        self.nodes: Optional[List[Any]] = None  # each rank's host; found on first need

    def hosts(self) -> List[Any]:
        """Each rank's host name, found once by exchanging host names over MPI;
        on the virtual cluster all ranks share one host unless ``comm.nodes`` is set."""
        if self.nodes is None:
            mpi_ranks = isinstance(self._t, MPITransport)
            self.nodes = discover(self._exchange, self.size) if mpi_ranks else [0] * self.size
        return self.nodes

    # -- the collectives ---------------------------------------------------------------------
    def allreduce(self, a: Any, op: str = "sum", algorithm: str = "auto",
                  out: Optional[np.ndarray] = None, label: Optional[str] = None,
                  context: int = 0) -> Any:
        """Elementwise reduction over all ranks; every rank gets the result.

        ``context``: an integer that every rank must pass equal (checked with the arguments,
        at no extra cost; a mismatch raises ``CallMismatchError`` naming each rank's value)."""
        # A small allreduce of a plain array is latency-bound: straight to recursive doubling.
        if type(a) is np.ndarray and algorithm == "auto" and a.flags.c_contiguous and \
                (a.nbytes <= select.ALLREDUCE_SMALL or self.size == 1):
            res = np.empty(a.shape, a.dtype) if out is None else _check_out(out, a.shape, a.dtype)
            return self._run_fused("allreduce", a, res, op, True, label, _same, context)
        return self.allreduce_async(a, op, algorithm, out, label, _block=True, context=context)

    def allreduce_async(self, a: Any, op: str = "sum", algorithm: str = "auto",
                        out: Optional[np.ndarray] = None, label: Optional[str] = None,
                        _block: bool = False, context: int = 0) -> Any:
        """Nonblocking ``allreduce``: returns a ``Work``; ``wait()`` gives the result."""
        x, restore = to_numpy(a)
        args.check_op("allreduce", op, x.dtype, self.rank, self.size)
        algo = choose("allreduce", x.nbytes, self.size, algorithm, self.hosts)
        res = self._output(out, x.shape, x.dtype)
        if algo == "recursive_doubling":
            return self._run_fused("allreduce", x, res, op, _block, label, restore, context)
        desc = ("allreduce", "op", op, "dtype", x.dtype, "shape", x.shape, "algorithm", algo)

        def finish(_: Any) -> Any:  # both algorithms leave the sum in ``res``
            return restore(finish_avg(res, self.size) if op == "avg" else res)
        if algo == "ring":
            ws = self._take(DEPTH * self.chunk_bytes)
            items = max(1, self.chunk_bytes // x.itemsize)

            def body(ch: Channel) -> Algorithm:
                return ring_allreduce(ch, x.reshape(-1), res.reshape(-1), op, items,
                                      ws[:DEPTH * items * x.itemsize].view(x.dtype))
            return self._run("allreduce", algo, desc, body, finish, _block, label, [ws],
                             context)
        return self._run_hierarchical(x, res, op, desc, finish, _block, label, context)

    def _run_hierarchical(self, x: np.ndarray, res: np.ndarray, op: str, desc: tuple,
                          finish: Callable[[Any], Any], block: bool,
                          label: Optional[str], context: int) -> Any:
        """``hierarchical.py``'s allreduce over ``self.hosts()``, with the scratch it needs."""
        nodes, items = self.hosts(), max(1, self.chunk_bytes // x.itemsize)
        ws, acc_buf = self._take(DEPTH * self.chunk_bytes), self._take(x.nbytes)

        def body(ch: Channel) -> Algorithm:
            return hierarchical_allreduce(ch, x.reshape(-1), res.reshape(-1), nodes, op, items,
                                          ws[:DEPTH * items * x.itemsize].view(x.dtype),
                                          acc_buf[:x.nbytes].view(x.dtype))
        return self._run("allreduce", "hierarchical", desc, body, finish, block, label,
                         [ws, acc_buf], context)

    def allgather(self, a: Any, algorithm: str = "auto", out: Optional[np.ndarray] = None,
                  label: Optional[str] = None) -> Any:
        """Rank-order concatenation along axis 0 of every rank's (same-shaped) array."""
        return self.allgather_async(a, algorithm, out, label, _block=True)

    def allgather_async(self, a: Any, algorithm: str = "auto", out: Optional[np.ndarray] = None,
                        label: Optional[str] = None, _block: bool = False) -> Any:
        """Nonblocking ``allgather``."""
        x, restore = to_numpy(a)
        x = x.reshape(1) if x.ndim == 0 else x
        args.check_dtype("allgather", x.dtype, self.rank, self.size)
        algo = choose("allgather", x.nbytes * self.size, self.size, algorithm)
        res = self._output(out, (self.size * x.shape[0],) + x.shape[1:], x.dtype)
        if algo == "recursive_doubling":
            return self._run_fused("allgather", x, res, None, _block, label, restore)
        desc = ("allgather", "dtype", x.dtype, "shape", x.shape, "algorithm", algo)
        items = max(1, self.chunk_bytes // x.itemsize)

        def body(ch: Channel) -> Algorithm:
            return ring_allgather(ch, x.reshape(-1), res.reshape(-1), items)
        return self._run("allgather", algo, desc, body, lambda r: restore(res), _block, label)

    def reduce_scatter(self, a: Any, op: str = "sum", algorithm: str = "auto",
                       out: Optional[np.ndarray] = None, label: Optional[str] = None) -> Any:
        """Reduce over ranks; rank r gets chunk r (of p near-equal axis-0 chunks)."""
        return self.reduce_scatter_async(a, op, algorithm, out, label, _block=True)

    def reduce_scatter_async(self, a: Any, op: str = "sum", algorithm: str = "auto",
                             out: Optional[np.ndarray] = None, label: Optional[str] = None,
                             _block: bool = False) -> Any:
        """Nonblocking ``reduce_scatter``."""
        x, restore = to_numpy(a)
        args.check_op("reduce_scatter", op, x.dtype, self.rank, self.size)
        if x.ndim == 0:
            raise ValueError("reduce_scatter needs an array with at least one axis")
        algo = choose("reduce_scatter", x.nbytes, self.size, algorithm)
        b, mine = _segments(x.shape, self.size, self.rank)
        res = self._output(out, (mine,) + x.shape[1:], x.dtype)
        if algo == "recursive_halving":
            return self._run_fused("reduce_scatter", x, res, op, _block, label, restore)
        desc = ("reduce_scatter", "op", op, "dtype", x.dtype, "shape", x.shape,
                "algorithm", algo)
        items = max(1, self.chunk_bytes // x.itemsize)
        # Partial sums passing through (only p - 2 segments of them are ever used).
        acc_buf, ws = self._take(x.nbytes), self._take(DEPTH * self.chunk_bytes)
        acc = acc_buf[:x.nbytes].view(x.dtype)
        tmp = ws[:DEPTH * items * x.itemsize].view(x.dtype)

        def body(ch: Channel) -> Algorithm:
            return ring_reduce_scatter_full(ch, x.reshape(-1), acc, b, op, items, tmp,
                                            res.reshape(-1))

        def finish(_: np.ndarray) -> Any:
            return restore(finish_avg(res, self.size) if op == "avg" else res)
        return self._run("reduce_scatter", algo, desc, body, finish, _block, label,
                         [acc_buf, ws])

    def broadcast(self, a: Any, root: int = 0, algorithm: str = "auto",
                  out: Optional[np.ndarray] = None, label: Optional[str] = None) -> Any:
        """Every rank gets root's array (others pass an array of the same shape and dtype).

        ``out=a`` (a numpy array) broadcasts in place, like ``MPI_Bcast``: no copy on the root.
        """
        return self.broadcast_async(a, root, algorithm, out, label, _block=True)

    def broadcast_async(self, a: Any, root: int = 0, algorithm: str = "auto",
                        out: Optional[np.ndarray] = None, label: Optional[str] = None,
                        _block: bool = False) -> Any:
        """Nonblocking ``broadcast``."""
        x, restore = to_numpy(a)
        root = args.check_rank("broadcast", "root", root, self.rank, self.size)
        args.check_dtype("broadcast", x.dtype, self.rank, self.size)
        algo = choose("broadcast", x.nbytes, self.size, algorithm)
        desc = ("broadcast", "root", root, "dtype", x.dtype, "shape", x.shape,
                "algorithm", algo)
        res = self._output(out, x.shape, x.dtype)
        if self.rank == root and res is not x:
            res[...] = x
        items = max(1, self.chunk_bytes // x.itemsize)

        def body(ch: Channel) -> Algorithm:
            return binomial_broadcast(ch, res.reshape(-1), root, items)
        return self._run("broadcast", algo, desc, body, lambda r: restore(res), _block, label)

    def reduce(self, a: Any, root: int = 0, op: str = "sum", algorithm: str = "auto",
               label: Optional[str] = None) -> Any:
        """Reduction over ranks delivered to ``root``; other ranks get None."""
        return self.reduce_async(a, root, op, algorithm, label, _block=True)

    def reduce_async(self, a: Any, root: int = 0, op: str = "sum", algorithm: str = "auto",
                     label: Optional[str] = None, _block: bool = False) -> Any:
        """Nonblocking ``reduce``."""
        x, restore = to_numpy(a)
        root = args.check_rank("reduce", "root", root, self.rank, self.size)
        args.check_op("reduce", op, x.dtype, self.rank, self.size)
        algo = choose("reduce", x.nbytes, self.size, algorithm)
        desc = ("reduce", "root", root, "op", op, "dtype", x.dtype, "shape", x.shape,
                "algorithm", algo)
        res = self._results.empty(x.shape, x.dtype)
        items = max(1, self.chunk_bytes // x.itemsize)
        ws = self._take(items * x.itemsize)

        def body(ch: Channel) -> Algorithm:
            return binomial_reduce(ch, x.reshape(-1), res.reshape(-1), root, op, items,
                                   ws[:items * x.itemsize].view(x.dtype))

        def finish(_: np.ndarray) -> Any:
            if self.rank != root:
                return None
            return restore(finish_avg(res, self.size) if op == "avg" else res)
        return self._run("reduce", algo, desc, body, finish, _block, label, [ws])

    def alltoall(self, a: Any, algorithm: str = "auto", label: Optional[str] = None) -> Any:
        """Axis-0 chunk j goes to rank j; the chunks received are concatenated in rank order."""
        return self.alltoall_async(a, algorithm, label, _block=True)

    def alltoall_async(self, a: Any, algorithm: str = "auto", label: Optional[str] = None,
                       _block: bool = False) -> Any:
        """Nonblocking ``alltoall``."""
        x, restore = to_numpy(a)
        if x.ndim == 0:
            raise ValueError("alltoall needs an array with at least one axis")
        args.check_dtype("alltoall", x.dtype, self.rank, self.size)
        algo = choose("alltoall", x.nbytes, self.size, algorithm)
        desc = ("alltoall", "dtype", x.dtype, "shape", x.shape, "algorithm", algo)
        b = chunk_bounds(x.shape[0], self.size)
        row = math.prod(x.shape[1:])
        res = self._results.empty((self.size * (b[self.rank + 1] - b[self.rank]),) + x.shape[1:],
                                  x.dtype)

        def body(ch: Channel) -> Algorithm:
            return pairwise_alltoall(ch, x.reshape(-1), res.reshape(-1), x.shape[0], row)
        return self._run("alltoall", algo, desc, body, lambda r: restore(res), _block, label)

    def barrier(self, label: Optional[str] = None) -> None:
        """Return only once every rank has entered the barrier."""
        self._run("barrier", "check", ("barrier",), lambda ch: _nothing(), lambda r: None, True,
                  label)

    # -- groups, labels, failure ---------------------------------------------------------------
    def split(self, color: int, key: int = 0) -> "Communicator":
        """Sub-communicators of the ranks with equal ``color``, ordered by ``key`` (collective).

        The new communicator has its own ``stats``, ``ledger`` and regions."""
        color, key = (args.check_int("split", n, v, self.rank, self.size)
                      for n, v in (("color", color), ("key", key)))
        child = self._t.split(color, key, self._exchange)
        comm = Communicator(child, self.timeout, self.chunk_bytes)
        child.free()  # the new communicator works on its own copies
        return comm

    def region(self, name: str) -> ContextManager[None]:
        """Label every call in the block ``name`` in the ledger (regions nest with "/")."""
        return self._regions.region(name)

    def abort(self, code: int = 1) -> None:
        """Terminate every rank of the job (``MPI_Abort``; on the virtual cluster every rank
        raises ``CommAbortedError``)."""
        self._t.abort(code)

    def reset_stats(self) -> None:
        """Forget the byte and call counters."""
        self.stats.clear()

    # -- plumbing ----------------------------------------------------------------------------
    def _tag(self) -> int:
        self._seq += 1
        return ((self._seq - 1) % self._tags) * 4

    def _describe(self, name: str, chans: List[Channel], p2p: bool = False) -> "_Describe":
        if p2p:
            self._p2p_calls += 1
        return _Describe(self, name, self._p2p_calls if p2p else self._seq, chans)

    def _drive_or_work(self, gen: Algorithm, describe: Callable[[], str],
                       finish: Callable[[Any], Any], block: bool) -> Any:
        if block:
            return finish(drive(gen, self._t, self.timeout, describe))
        return Work(gen, self._t, self.timeout, describe, finish)

    def _run(self, name: str, algo: str, desc: tuple, body: Callable[[Channel], Algorithm],
             finish: Callable[[Any], Any], block: bool, label: Optional[str],
             bufs: Optional[list] = None, context: int = 0) -> Any:
        """Argument check (``desc`` and ``context``), then ``body``, driven now (block) or
        returned as a ``Work``."""
        stat = self._stat(name)
        stat["calls"] += 1
        tag = self._tag()
        ctl, ch, describe = self._channels(name, tag, block)
        t0 = time.perf_counter() if self.ledger.enabled else None
        label = self._regions.label(label)

        check = self._check_buffers(block)
        metadata.fill_header(check, desc, context)

        def checked() -> Algorithm:
            try:
                result = yield from _overlapped(
                    self.size, recursive_doubling_allreduce(ctl, check), body,
                    lambda: self._raise_if_mismatch(check, tag, desc, describe, context), ch,
                    self.overlap_check)
                if t0 is not None:
                    self._record(name, algo, label, ch, t0)
                # Only now: a mismatch or timeout leaves messages posted into these buffers.
                self._pool.extend(bufs or [])
                if not block:
                    self._check_free.append(check)
                return result
            except BaseException:
                if block:  # messages may still be posted into them: never reuse
                    self._check = RecursiveDoublingBuffers(0, np.uint8, "min", self._t)
                raise
            finally:
                ctl.flush(self._stat("check"))
                ch.flush(stat)
        return self._drive_or_work(checked(), describe, finish, block)

    def _channels(self, name: str, tag: int, block: bool) -> tuple:
        """The check's channel on ``tag``, the algorithm's on ``tag + 1`` and the timeout
        message: one reused set for blocking calls (made afresh they cost about 1 us), a new
        set for each nonblocking one."""
        if not block:
            ctl, ch = Channel(self._t, tag), Channel(self._t, tag + 1)
            return ctl, ch, self._describe(name, [ctl, ch])
        ctl, ch, describe = self._blocking
        ctl.restart(tag)
        ch.restart(tag + 1)
        describe.name, describe.seq = name, self._seq
        return ctl, ch, describe

    def _check_buffers(self, block: bool) -> RecursiveDoublingBuffers:
        """The 16-byte argument-check buffers: one set for blocking calls, a set per pending
        nonblocking call (reused once it has finished)."""
        if block:
            return self._check
        if self._check_free:
            return self._check_free.pop()
        return RecursiveDoublingBuffers(0, np.uint8, "min", self._t)

    def _run_fused(self, name: str, x: np.ndarray, res: np.ndarray, op: Optional[str],
                   block: bool, label: Optional[str], restore: Callable[[Any], Any],
                   context: int = 0) -> Any:
        """A recursive-doubling allreduce or allgather or a recursive-halving reduce-scatter,
        the argument check carried in its data messages (``latency_bound.py``): blocking or
        not, the one path of the small allreduce."""
        call = self._fused_call(name, x, op, block)
        call.source[...] = x
        call.bufs.set_header(metadata.with_context(call.hash, context))
        tag = self._tag()
        call.channel.restart(tag)
        call.describe.seq = self._seq
        call.stat["calls"] += 1
        t0 = time.perf_counter() if self.ledger.enabled else None
        steps = self._fused_steps(call, tag, res, op, t0, self._regions.label(label), restore,
                                  context)
        return self._drive_or_work(steps, call.describe, _same, block)

    def _fused_steps(self, call: "_Fused", tag: int, res: np.ndarray, op: Optional[str],
                     t0: Optional[float], label: Optional[str],
                     restore: Callable[[Any], Any], context: int) -> Algorithm:
        """The algorithm, then the check of the headers, the result and the counters."""
        ch = call.channel
        try:
            yield from call.steps(ch, call.bufs)
            self._raise_if_mismatch(call.bufs, tag, call.desc, call.describe, context)
            res[...] = call.result
        except BaseException:
            if self._fused.get(call.key) is call:  # messages may be posted into its buffers
                del self._fused[call.key]
            raise
        finally:
            ch.flush(call.stat, call.check_stat)
        if t0 is not None:
            self._record(call.name, call.algo, label, ch, t0)
        return restore(finish_avg(res, self.size) if op == "avg" else res)

    def _fused_call(self, name: str, x: np.ndarray, op: Optional[str], block: bool) -> "_Fused":
        """The cached ``_Fused`` of this (collective, shape, dtype, op) for a blocking call,
        else a fresh one (a nonblocking call may be in flight beside others)."""
        key = (name, x.shape, x.dtype, op)
        call = self._fused.get(key) if block else None
        if call is None or call.stat is not self.stats.get(name):
            call = self._new_fused(key, x)
            if block:
                if len(self._fused) >= 64:  # bounded: a long run may see many shapes
                    self._fused.clear()
                self._fused[key] = call
        return call

    def _new_fused(self, key: tuple, x: np.ndarray) -> "_Fused":
        """Buffers, views and description of a recursive-doubling allreduce or allgather, or a
        recursive-halving reduce-scatter."""
        name, _, _, op = key
        desc: tuple = ("dtype", x.dtype, "shape", x.shape, "algorithm", "recursive_doubling")
        if name == "reduce_scatter":
            b, mine = _segments(x.shape, self.size, self.rank)
            rs = ReduceScatterBuffers(b, x.dtype, op, self._t)
            result = rs.data[b[self.rank]:b[self.rank + 1]].reshape((mine,) + x.shape[1:])
            return _Fused(self, key, ("reduce_scatter", "op", op) + desc[:-1]
                          + ("recursive_halving",), rs, recursive_halving_reduce_scatter,
                          rs.data.reshape(x.shape), result)
        if name == "allreduce":
            args.check_op("allreduce", op, x.dtype, self.rank, self.size)
            rd = RecursiveDoublingBuffers(x.nbytes, x.dtype, op, self._t)
            shaped = rd.data.reshape(x.shape)
            return _Fused(self, key, ("allreduce", "op", op) + desc, rd,
                          recursive_doubling_allreduce, shaped, shaped)
        n, p = x.nbytes, self.size
        ag = AllgatherBuffers(n, p, self._t)
        source = ag.work[self.rank * n:(self.rank + 1) * n].view(x.dtype).reshape(x.shape)
        result = ag.work[:p * n].view(x.dtype).reshape((p * x.shape[0],) + x.shape[1:])
        return _Fused(self, key, ("allgather",) + desc, ag, recursive_doubling_allgather,
                      source, result)

    def _record(self, name: str, algo: str, label: Optional[str], ch: Channel, t0: float,
                peer: Optional[int] = None) -> None:
        sent, recvd, msgs = ch.payload()
        self.ledger.add((name, algo, label, sent, recvd, msgs, time.perf_counter() - t0, peer))

    def _exchange(self, vals: np.ndarray) -> np.ndarray:
        """Allgather of a small int64 array on split's own tag (not in stats or the ledger)."""
        ch = Channel(self._t, _SPLIT_TAG)
        out = np.empty(vals.size * self.size, dtype=np.int64)
        describe = _Describe(self, "split", self._seq, [ch])
        return drive(ring_allgather(ch, vals, out, vals.size), self._t, self.timeout, describe)

    def _raise_if_mismatch(self, bufs: Any, tag: int, desc: tuple,
                           describe: Callable[[], str], context: int) -> None:
        if self.size > 1 and not bufs.agrees():
            raise metadata.mismatch_error(self._t, tag + 2, desc, self.timeout, describe,
                                          context)

    def _stat(self, name: str) -> Stat:
        stat = self.stats.get(name)
        if stat is None:
            stat = self.stats[name] = new_stat()
        return stat

    def _output(self, out: Optional[np.ndarray], shape: tuple, dtype: Any) -> np.ndarray:
        """``out`` checked, or a result array (large ones reuse dropped results' memory)."""
        if out is None:
            return self._results.empty(shape, dtype)
        return _check_out(out, shape, dtype)

    def _take(self, nbytes: int) -> np.ndarray:
        """A reusable scratch buffer of at least ``nbytes`` (returned to the pool after use)."""
        for i, buf in enumerate(self._pool):
            if buf.nbytes >= nbytes:
                return self._pool.pop(i)
        return np.empty(max(nbytes, 1), dtype=np.uint8)


class _Fused:
    """A collective whose argument check rides in its data messages: its buffers and
    algorithm (``latency_bound.py``), where the input goes in (``source``) and the result comes
    out (``result``), its description and hash, channel, timeout message and counters."""

    __slots__ = ("key", "name", "algo", "desc", "hash", "bufs", "steps", "source", "result",
                 "channel", "describe", "stat", "check_stat")

    def __init__(self, comm: Communicator, key: tuple, desc: tuple, bufs: Any,
                 steps: Callable[[Channel, Any], Algorithm], source: np.ndarray,
                 result: np.ndarray) -> None:
        self.key, self.name, self.desc, self.bufs, self.steps = key, key[0], desc, bufs, steps
        self.algo = desc[-1]
        self.hash = metadata.describe_hash(desc)
        self.source, self.result = source, result
        self.channel = Channel(comm.transport, 0, bufs.header)
        self.describe = _Describe(comm, self.name, 0, [self.channel])
        self.stat, self.check_stat = comm._stat(self.name), comm._stat("check")


class _Describe:
    """What a waiting call is doing: ``what()`` for deadlock reports, ``()`` for timeouts."""

    __slots__ = ("comm", "name", "seq", "chans")

    def __init__(self, comm: Communicator, name: str, seq: int, chans: List[Channel]) -> None:
        self.comm, self.name, self.seq, self.chans = comm, name, seq, chans

    def what(self) -> str:
        peers = sorted({q for c in self.chans for q in c.peers[-4:]})
        return (f"{self.name} (call #{self.seq}) on rank {self.comm.rank} of {self.comm.size}, "
                f"waiting for ranks {peers}")

    def __call__(self) -> str:
        peers = sorted({q for c in self.chans for q in c.peers[-4:]})
        return (f"needle.parallel: {self.name} (call #{self.seq}) on rank {self.comm.rank} of "
                f"{self.comm.size} did not finish within {self.comm.timeout:g} s "
                f"(NEEDLE_COMM_TIMEOUT); waiting for ranks {peers}"
                f"{where(peers, self.comm.nodes)}")


def create(mpi_comm: Any = None, timeout: Optional[float] = None,
           abort_on_error: bool = True, blas_threads: Optional[int] = None) -> Communicator:
    """A ``Communicator`` over ``mpi_comm`` (default ``MPI.COMM_WORLD``).

    With ``abort_on_error`` an uncaught exception on any rank aborts the whole MPI job (exit code
    1) instead of leaving the other ranks waiting for it. Each rank's BLAS/OpenMP threads are
    limited to its share of the node's cores unless ``blas_threads`` or the environment says
    otherwise (``threads.py``).
    """
    MPI = mpi()
    if abort_on_error:
        install_abort_hook()
    world = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    # Every rank arrives (with a deadline) inside Communicator() before the blocking setup
    # collectives below: a rank that ended before create() must not leave the others in them.
    comm = Communicator(world, timeout)
    threads.place(world, blas_threads)
    # Each rank's host, once, now (so a timeout can name the hosts of the ranks it waited
    # for): setup metadata through MPI itself, like the Dup above, so that no exercise's code
    # runs before the user's first call.
    comm.nodes = world.allgather(host_name())
    return comm


def _check_out(out: np.ndarray, shape: tuple, dtype: Any) -> np.ndarray:
    if not isinstance(out, np.ndarray) or out.shape != tuple(shape) or out.dtype != dtype \
            or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous numpy array of shape {shape}, {dtype}")
    return out


def _overlapped(size: int, check: Algorithm, make_body: Callable[[Channel], Algorithm],
                verify: Callable[[], None], ch: Channel, overlap: bool = True) -> Algorithm:
    """Run the argument ``check`` and ``body`` with the check's messages in flight together with
    the body's first messages, so the check adds no round trip to the call.

    Safe on mismatched arguments: before the check has finished the body has only *posted*
    messages (a generator posts, then yields what it waits for); nothing of the body is waited
    for until ``verify()`` has passed, so a rank never blocks on a message that a rank with
    other arguments will not send.  (A mismatch leaves those posted messages pending; they are
    on this call's own tag, which no later call reuses before the tags wrap around.)
    """
    if size == 1:
        return (yield from make_body(ch))
    if not overlap:
        yield from check
        verify()
        return (yield from make_body(ch))
    body = make_body(ch)
    item = next(check)  # the check's first exchange is posted first...
    try:
        first = next(body)  # ...then the body's first messages, which overlap it
    except StopIteration as stop:
        first, done = None, stop
    else:
        done = None
    try:
        while True:
            item = check.send((yield item))
    except StopIteration:
        pass
    verify()
    if done is not None:
        return done.value
    try:
        item = first
        while True:
            item = body.send((yield item))
    except StopIteration as stop:
        return stop.value


@lru_cache(maxsize=256)
def _segments(shape: tuple, p: int, r: int) -> tuple:
    """Item offsets of the p reduce-scatter segments of an array of ``shape`` (near-equal
    axis-0 chunks), and the rows of rank r's (cached: a call's Python costs as much as a
    64 KiB message)."""
    row = math.prod(shape[1:])
    rows = chunk_bounds(shape[0], p)
    return tuple(k * row for k in rows), rows[r + 1] - rows[r]


def _same(result: Any) -> Any:
    return result


def _nothing() -> Algorithm:
    return None
    yield  # a generator that finishes at once

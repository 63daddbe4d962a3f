"""The communicator: the object every distributed feature of needle is handed explicitly.

    from needle.parallel import communicator
    comm = communicator.create()              # MPI.COMM_WORLD, or create(some_mpi_comm)
    total = comm.allreduce(grad, op="sum")    # numpy array, needle NDArray or Tensor
    work = comm.allreduce_async(grad); ...; total = work.wait()

Each collective is a row of ``collectives.py``'s table, all run by ``_call``: the check that
all ranks passed the same arguments (``metadata.py``), the algorithm ``select.choose`` picks
(or ``algorithm=`` names), the wait with a deadline (``progress.py``; ``NEEDLE_COMM_TIMEOUT``
seconds, default 60) now or in a ``Work``, ``comm.stats`` and a ``comm.ledger`` record (named
by ``label=`` and ``comm.region``).

Conventions: allgather concatenates along axis 0 in rank order (all ranks pass the same shape);
reduce_scatter gives rank r chunk r of p near-equal axis-0 chunks (the first ``n % p`` chunks
one row longer, like ``np.array_split``); alltoall sends axis-0 chunk j to rank j.  ``op="avg"``
is the sum divided by p, floor-divided for integer dtypes and rejected for bool.
"""
import os
import socket
import time
from collections.abc import Hashable
from typing import Any, ContextManager, Dict, List, Optional

import numpy as np

from ... import threads
from ...faults import install_abort_hook
from ..algorithms.reference import finish_avg
from ..algorithms.ring import ring_allgather
from ..algorithms.select import ALGORITHMS, choose
from ..hosts import discover
from ..ledger import Ledger, Regions
from ..progress import Algorithm, Channel, Stat, Transport, Waiting, Work, drive, start, stat
from ..transport import stuck
from ..transport.mpi import MPITransport
from ..transport.mpi_runtime import mpi
from . import args, metadata
from . import collectives as table
from .collectives import NO_DATA, NO_SCRATCH, CallState, Spec
from .convert import same, to_numpy
from .p2p import ANY_SOURCE, ANY_TAG, PointToPoint
from .result_pool import ResultPool

# What should return at once: one MPI call each (``transport/stuck.py`` watches them).
_ONE_MPI_CALL = (Channel.isend, Channel.irecv, MPITransport.dup, MPITransport.split)
_SPLIT_TAG = 3  # collective calls use tags 4k, 4k+1, 4k+2; split's exchange uses 4k+3
_KEEP = 64  # keys the cache holds at most (a long run may see many shapes)
Out = Optional[np.ndarray]
Label = Optional[str]


class Communicator:
    """A group of ranks with collectives and point-to-point messages, over MPI or in-process."""

    ANY_SOURCE = ANY_SOURCE
    ANY_TAG = ANY_TAG
    # False: the argument check finishes before the first data message (no overlap).
    overlap_check = True

    def __init__(self, comm: Any, timeout: Optional[float] = None,
                 chunk_bytes: Optional[int] = None) -> None:
        """``comm``: an mpi4py communicator or a transport (``transport/``)."""
        env = os.environ.get("NEEDLE_COMM_TIMEOUT", "60")
        self.timeout = args.check_timeout(env if timeout is None else timeout,
                                          "NEEDLE_COMM_TIMEOUT" if timeout is None else "timeout=")
        base: Transport = comm if hasattr(comm, "poll") else \
            MPITransport(comm, timeout=self.timeout)
        if isinstance(base, MPITransport) and base.size > 1:  # a call that never returns
            stuck.watch(self.timeout, base.rank, base.abort, _ONE_MPI_CALL)
        # Private contexts: collectives, p2p and the user's own MPI messages never match.
        self.transport = self._t = base.dup()
        self.rank, self.size = self._t.rank, self._t.size
        if chunk_bytes is None:
            chunk_bytes = args.env_bytes("NEEDLE_RING_CHUNK", 1 << 20, minimum=1)
        elif int(chunk_bytes) < 1:
            raise ValueError(f"chunk_bytes must be at least 1 byte, got {chunk_bytes!r}")
        self.chunk_bytes = int(chunk_bytes)
        self.stats: Dict[str, Stat] = {}
        self.ledger = Ledger()
        self._regions = Regions()
        self.p2p = PointToPoint(self, base, self.stats, self.ledger, self._regions)
        self._seq = 0
        self._tags = max(1, self._t.tag_ub // 4)
        self._free: Dict[tuple, List[Any]] = {}  # call states and scratch, by key
        self._results = ResultPool()
        self.nodes: Optional[List[Hashable]] = None  # each rank's host; found on first need

    def hosts(self) -> List[Hashable]:
        """Each rank's host name, found once over MPI (virtual cluster: one host, or ``nodes``)."""
        if self.nodes is None:
            on_mpi = isinstance(self._t, MPITransport)
            self.nodes = list(discover(self._exchange, self.size)) if on_mpi else [0] * self.size
        return self.nodes

    def allreduce(self, a: Any, op: str = "sum", algorithm: str = "auto", out: Out = None,
                  label: Label = None, context: int = 0) -> Any:
        """Elementwise reduction over all ranks; every rank gets the result. ``context``: an int
        that every rank must pass equal (checked with the arguments, at no extra cost; a
        mismatch raises ``CallMismatchError`` naming each rank's value)."""
        return self._call(table.ALLREDUCE, a, algorithm, out, label, True, op, 0, context)

    def allreduce_async(self, a: Any, op: str = "sum", algorithm: str = "auto",
                        out: Out = None, label: Label = None, context: int = 0) -> Work:
        """Nonblocking ``allreduce``: returns a ``Work``; ``wait()`` gives the result."""
        return self._call(table.ALLREDUCE, a, algorithm, out, label, False, op, 0, context)

    def allgather(self, a: Any, algorithm: str = "auto", out: Out = None,
                  label: Label = None) -> Any:
        """Rank-order concatenation along axis 0 of every rank's (same-shaped) array."""
        return self._call(table.ALLGATHER, a, algorithm, out, label, True)

    def allgather_async(self, a: Any, algorithm: str = "auto", out: Out = None,
                        label: Label = None) -> Work:
        """Nonblocking ``allgather``."""
        return self._call(table.ALLGATHER, a, algorithm, out, label, False)

    def reduce_scatter(self, a: Any, op: str = "sum", algorithm: str = "auto", out: Out = None,
                       label: Label = None) -> Any:
        """Reduce over ranks; rank r gets chunk r (of p near-equal axis-0 chunks)."""
        return self._call(table.REDUCE_SCATTER, a, algorithm, out, label, True, op)

    def reduce_scatter_async(self, a: Any, op: str = "sum", algorithm: str = "auto",
                             out: Out = None, label: Label = None) -> Work:
        """Nonblocking ``reduce_scatter``."""
        return self._call(table.REDUCE_SCATTER, a, algorithm, out, label, False, op)

    def broadcast(self, a: Any, root: int = 0, algorithm: str = "auto", out: Out = None,
                  label: Label = None) -> Any:
        """Every rank gets root's array (others pass an array of the same shape and dtype);
        ``out=a`` (a numpy array) broadcasts in place, like ``MPI_Bcast``."""
        return self._call(table.BROADCAST, a, algorithm, out, label, True, None, root)

    def broadcast_async(self, a: Any, root: int = 0, algorithm: str = "auto", out: Out = None,
                        label: Label = None) -> Work:
        """Nonblocking ``broadcast``."""
        return self._call(table.BROADCAST, a, algorithm, out, label, False, None, root)

    def reduce(self, a: Any, root: int = 0, op: str = "sum", algorithm: str = "auto",
               label: Label = None) -> Any:
        """Reduction over ranks delivered to ``root``; other ranks get None."""
        return self._call(table.REDUCE, a, algorithm, None, label, True, op, root)

    def reduce_async(self, a: Any, root: int = 0, op: str = "sum", algorithm: str = "auto",
                     label: Label = None) -> Work:
        """Nonblocking ``reduce``."""
        return self._call(table.REDUCE, a, algorithm, None, label, False, op, root)

    def alltoall(self, a: Any, algorithm: str = "auto", label: Label = None) -> Any:
        """Axis-0 chunk j goes to rank j; the chunks received are concatenated in rank order."""
        return self._call(table.ALLTOALL, a, algorithm, None, label, True)

    def alltoall_async(self, a: Any, algorithm: str = "auto", label: Label = None) -> Work:
        """Nonblocking ``alltoall``."""
        return self._call(table.ALLTOALL, a, algorithm, None, label, False)

    def barrier(self, label: Label = None) -> None:
        """Return only once every rank has entered the barrier."""
        self._call(table.BARRIER, NO_DATA, "check", None, label, True)

    def send(self, a: Any, dest: int, tag: int = 0, label: Label = None) -> None:
        """Send an array to ``dest``; returns once the buffer may be reused."""
        self.p2p.isend(a, dest, tag, label, True)

    def isend(self, a: Any, dest: int, tag: int = 0, label: Label = None) -> Work:
        """Nonblocking ``send``: a ``Work`` (do not modify the array before ``wait()``)."""
        return self.p2p.isend(a, dest, tag, label, False)

    def recv(self, source: int, tag: int = 0, out: Out = None, label: Label = None,
             return_status: bool = False) -> Any:
        """Receive an array from ``source`` (or ``ANY_SOURCE``) with ``tag`` (or ``ANY_TAG``);
        with ``return_status`` returns ``(array, P2PStatus(source, tag))``."""
        return self.p2p.irecv(source, tag, out, label, return_status, True)

    def irecv(self, source: int, tag: int = 0, out: Out = None, label: Label = None,
              return_status: bool = False) -> Work:
        """Nonblocking ``recv``: a ``Work`` whose ``wait()`` gives what ``recv`` returns."""
        return self.p2p.irecv(source, tag, out, label, return_status, False)

    def split(self, color: int, key: int = 0) -> "Communicator":
        """Sub-communicators of the ranks with equal ``color``, ordered by ``key`` (collective);
        each has its own ``stats``, ``ledger`` and regions."""
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

    def _call(self, spec: Spec, a: Any, algorithm: str, out: Out, label: Label, block: bool,
              op: Optional[str] = None, root: int = 0, context: int = 0) -> Any:
        """The call: its state (kept by its arguments: each kind of call is checked and its
        algorithm chosen once), result, tag and header; its steps run now or as a ``Work``."""
        if type(a) is np.ndarray and a.flags.c_contiguous:  # the common case, first
            x, restore = a, same
        else:
            x, restore = to_numpy(a)
        if spec.gather and x.ndim == 0:
            x = x.reshape(1)  # a scalar is one row
        key = (spec.name, algorithm, x.shape, x.dtype, op, root)
        try:
            free = self._free.get(key)
        except TypeError:  # an unhashable argument: the checks name it
            free = None
        st = free.pop() if free else self._state(spec, key, x)
        st.x, st.restore = x, restore
        st.res = _check_out(out, st.shape, x.dtype) if out is not None else \
            self._results.empty(st.shape, x.dtype) if st.pooled else np.empty(st.shape, x.dtype)
        counts = self.stats.get(spec.name) or stat(self.stats, spec.name)
        counts["calls"] += 1
        self._seq += 1
        tag = ((self._seq - 1) % self._tags) * 4
        if st.ctl is None:
            st.ch.restart(tag)
            st.source[...] = x
        else:
            st.ctl.restart(tag)
            st.ch.restart(tag + 1)
        st.waiting.seq = self._seq
        st.check.set_header(metadata.with_context(st.hash, context) if context else st.hash)
        t0 = time.perf_counter() if self.ledger.enabled else None
        steps = self._steps(st, tag, context, t0, self._regions.label(label), counts)
        return start(steps, self._t, self.timeout, st.waiting, same, block)

    def _state(self, spec: Spec, key: tuple, x: np.ndarray) -> CallState:
        """A new kind of call: this rank's own checks (``args.py``), algorithm and buffers."""
        _, algorithm, _, _, op, root = key
        p, r = self.size, self.rank
        if spec.rooted:
            root = args.check_rank(spec.name, "root", root, r, p)
        if spec.reduces:
            args.check_op(spec.name, op, x.dtype, r, p)
        if x.ndim == 0 and spec.whole:
            raise ValueError(f"{spec.name} needs an array with at least one axis")
        if not spec.reduces:
            args.check_dtype(spec.name, x.dtype, r, p)
        nbytes = x.nbytes * p if spec.gather else x.nbytes
        chosen = spec.name in ALGORITHMS  # (a barrier has no algorithm to choose)
        algo = choose(spec.name, nbytes, p, algorithm, self.hosts) if chosen else algorithm
        st = CallState(self, self._t, spec, key, algo, root, x, self.chunk_bytes, self.hosts)
        st.home = self._shelf(key)
        return st

    def _steps(self, st: CallState, tag: int, context: int, t0: Optional[float], label: Label,
               counts: Stat) -> Algorithm:
        """The check and the algorithm; then the counters, the ledger and the result."""
        spec, ch = st.spec, st.ch
        scratch = [self._scratch(n) for n in st.scratch] if st.scratch else NO_SCRATCH
        try:
            if st.ctl is None:  # the header rides in the data messages
                yield from st.steps(ch, st.check)
                self._verify(st, tag, context)
                st.res[...] = st.result
            else:
                verify = lambda: self._verify(st, tag, context)  # noqa: E731
                yield from metadata.overlapped(self.size, st.steps(st.ctl, st.check),
                                               st.method.run(st, ch, scratch), verify,
                                               self.overlap_check)
        finally:  # (after a failure messages may still be posted into st's buffers: not reused)
            check = self.stats.get("check") or stat(self.stats, "check")
            ch.flush(counts, check)
            if st.ctl is not None:
                st.ctl.flush(check)
        if t0 is not None:
            sent, recvd, msgs = ch.payload()
            self.ledger.add((spec.name, st.algo, label, sent, recvd, msgs,
                             time.perf_counter() - t0, None))
        res, restore = st.res, st.restore
        st.x = st.res = NO_DATA  # (a kept reference would keep the result pool from reusing it)
        st.home.append(st)  # back on its shelf (a cleared cache has dropped the shelf: gone)
        for buf in scratch:
            self._shelf(("scratch", buf.nbytes)).append(buf)
        if not st.finish:
            return restore(res)
        if st.op == "avg":
            finish_avg(res, self.size)
        return None if spec.root_only and self.rank != st.root else restore(res)

    def _verify(self, st: CallState, tag: int, context: int) -> None:
        if self.size > 1 and not st.check.agrees():
            raise metadata.mismatch_error(self._t, tag + 2, st.desc, self.timeout, st.waiting,
                                          context)

    def _scratch(self, nbytes: int) -> np.ndarray:
        free = self._shelf(("scratch", nbytes))
        return free.pop() if free else np.empty(nbytes, np.uint8)

    def _shelf(self, key: tuple) -> List[Any]:
        """The cache's list of free things (call states, scratch buffers) for ``key``."""
        free = self._free.get(key)
        if free is None:
            if len(self._free) >= _KEEP:
                self._free.clear()
            free = self._free[key] = []
        return free

    def _exchange(self, vals: np.ndarray) -> np.ndarray:
        """Allgather of a small int64 array on split's own tag (not in stats or the ledger)."""
        ch = Channel(self._t, _SPLIT_TAG)
        out = np.empty(vals.size * self.size, dtype=np.int64)
        waiting = Waiting(self, "split", self._seq, [ch])
        return drive(ring_allgather(ch, vals, out, vals.size), self._t, self.timeout, waiting)


def create(mpi_comm: Any = None, timeout: Optional[float] = None,
           abort_on_error: bool = True, blas_threads: Optional[int] = None) -> Communicator:
    """A ``Communicator`` over ``mpi_comm`` (default ``MPI.COMM_WORLD``); ``abort_on_error``:
    an uncaught exception on any rank aborts the job; ``blas_threads``: see ``threads.py``."""
    MPI = mpi()
    if abort_on_error:
        install_abort_hook()
    world = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    # Every rank arrives (with a deadline) in Communicator() before the blocking setup below.
    comm = Communicator(world, timeout)
    threads.place(world, blas_threads)
    # Hosts (for timeout messages) via MPI itself, like the Dup: no exercise code runs in create().
    comm.nodes = world.allgather(socket.gethostname())
    return comm


def _check_out(out: np.ndarray, shape: tuple, dtype: Any) -> np.ndarray:
    if not isinstance(out, np.ndarray) or out.shape != tuple(shape) or out.dtype != dtype \
            or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous numpy array of shape {shape}, {dtype}")
    return out

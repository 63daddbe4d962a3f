"""The MPI transport: one process per rank, point-to-point messages through mpi4py.

Waiting polls ``MPI.Request.Testall`` (not ``Waitall``) so that a call that cannot finish
raises ``CommTimeoutError`` after ``timeout`` seconds; MPICH's ``Waitall`` spins too, so this
costs no more CPU. After ``spin`` empty polls a rank yields its core (at once when the node is
oversubscribed: a spinning rank would hold the core its peer needs).
"""
import os
import time
from typing import Any, Callable, Optional

import numpy as np

from .... import numbers as strict
from ..errors import CommTimeoutError
from .mpi_runtime import mpi

_POLLS_BEFORE_YIELD = 256


class MPITransport:
    """Nonblocking point-to-point messages on one mpi4py communicator."""

    def __init__(self, mpi_comm: Any, spin: Optional[int] = None,
                 timeout: Optional[float] = None) -> None:
        """``timeout``: first wait (with this deadline) until every rank of ``mpi_comm`` has
        arrived, so that a rank that never comes cannot hang the collective ``Dup`` calls."""
        MPI = mpi()
        if timeout is not None and mpi_comm.Get_size() > 1:
            arrive(mpi_comm, timeout)
        self.comm = mpi_comm
        self.rank: int = mpi_comm.Get_rank()
        self.size: int = mpi_comm.Get_size()
        self.isend = mpi_comm.Isend  # (buf, dest, tag): the Channel calls MPI directly
        self.irecv = mpi_comm.Irecv
        self.ANY_SOURCE, self.ANY_TAG, self.byte = MPI.ANY_SOURCE, MPI.ANY_TAG, MPI.BYTE
        self.tag_ub = min(mpi_comm.Get_attr(MPI.TAG_UB) or 32767, 1 << 29)
        self.spin = _spin_polls(mpi_comm) if spin is None else spin
        self._testall, self._error = MPI.Request.Testall, MPI.Exception

    def new_status(self) -> Any:
        """A status object for ``poll((requests, statuses))``."""
        return mpi().Status()

    def dup(self) -> "MPITransport":
        """A transport on a private copy of this communicator (its messages never mix)."""
        return MPITransport(self.comm.Dup(), self.spin)

    def split(self, color: int, key: int, exchange: Any = None) -> "MPITransport":
        """The transport of the ranks with equal ``color``, ordered by ``key`` (collective), after
        ``exchange`` (an allgather with the deadline ``MPI_Comm_split`` lacks)."""
        if exchange is not None:
            exchange(np.array([color, key], dtype=np.int64))
        return MPITransport(self.comm.Split(color, key), self.spin)

    def free(self) -> None:
        """Release the MPI communicator."""
        self.comm.Free()

    def abort(self, code: int) -> None:
        """End every rank of the job (``MPI_Abort``)."""
        self.comm.Abort(code)

    def poll(self, item: Any) -> Optional[bool]:
        """Test ``item`` (requests, or ``(requests, statuses)``) once: None if still in flight,
        else whether a receive was truncated (a peer with other arguments sent more bytes): the
        algorithm then runs to the end, so every rank learns of the mismatch and none hangs."""
        reqs, statuses = item if type(item) is tuple else (item, None)
        try:
            return False if self._testall(reqs, statuses) else None
        except self._error as err:
            return self._truncated(err, reqs)

    def _truncated(self, err: Any, reqs: list) -> bool:
        MPI = mpi()
        if err.Get_error_class() not in (MPI.ERR_IN_STATUS, MPI.ERR_TRUNCATE):
            raise err
        # One request at a time: a request that ended in error may stay in the list (MPICH
        # keeps a truncated large receive), and testing it again raises again.
        for req in reqs:
            while req != MPI.REQUEST_NULL:
                try:
                    if req.Test():
                        break
                except self._error:
                    break  # this request ended in error
        return True

    def wait(self, item: Any, timeout: float, describe: Callable[[], str]) -> bool:
        """Wait for ``item`` with a deadline; after ``spin`` empty polls, yield the core between."""
        reqs, statuses = item if type(item) is tuple else (item, None)
        testall = self._testall
        polls, deadline, spin = 0, None, self.spin
        try:
            while not testall(reqs, statuses):  # the hot loop: nothing but Testall
                polls += 1
                if polls > spin:
                    os.sched_yield()  # let a peer sharing our core run (oversubscribed jobs)
                if polls & 63 == 0:
                    now = time.monotonic()
                    deadline = deadline or now + timeout
                    if now > deadline:
                        raise CommTimeoutError(describe())
        except self._error as err:
            return self._truncated(err, reqs)
        return False

    def idle(self) -> None:
        """A nonblocking test found nothing: MPI progresses by itself."""


def arrive(mpi_comm: Any, timeout: float) -> None:
    """A barrier that raises ``CommTimeoutError`` after ``timeout`` s (``MPI_Ibarrier`` polled)."""
    req, deadline = mpi_comm.Ibarrier(), time.monotonic() + timeout
    while not req.Test():
        if time.monotonic() > deadline:
            raise CommTimeoutError(
                f"needle.parallel: creating a communicator on rank {mpi_comm.Get_rank()} of "
                f"{mpi_comm.Get_size()}: not every rank arrived within {timeout:g} s "
                "(NEEDLE_COMM_TIMEOUT); a rank ended or is stuck before creating it")
        os.sched_yield()


def _spin_polls(mpi_comm: Any) -> int:
    """Empty polls before a waiting rank yields its core: 256, or 0 when this node is
    oversubscribed (more ranks than cores); ``NEEDLE_POLLS_BEFORE_YIELD`` overrides."""
    env = os.environ.get("NEEDLE_POLLS_BEFORE_YIELD")
    if env is not None:
        return strict.count(env, "NEEDLE_POLLS_BEFORE_YIELD")
    local = mpi_comm.Split_type(mpi().COMM_TYPE_SHARED)
    ranks_here = local.Get_size()
    local.Free()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 0 if ranks_here > (cores or 1) else _POLLS_BEFORE_YIELD

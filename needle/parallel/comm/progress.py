"""Running a collective: point-to-point channels, waiting with a deadline, and async handles.

Every MPI algorithm in this package is written as a *generator* that posts nonblocking
sends/receives (``Isend``/``Irecv``) and then ``yield``s the list of requests it must see
complete before it can go on.  Whoever drives the generator decides how to wait:

* ``drive`` runs it to the end right away (the blocking collectives);
* ``Work`` keeps it suspended, so the caller can compute while messages fly, and finishes it in
  ``Work.wait()`` (the ``*_async`` collectives, for overlapping communication with compute).

Waiting is a polling loop over ``MPI.Request.Testall`` rather than ``Waitall``, so that a
collective that cannot finish (a peer that never arrives) raises ``CommTimeoutError`` after
``timeout`` seconds instead of hanging forever.  MPICH's own ``Waitall`` also spins, so polling
costs no more CPU; after a few hundred empty polls we ``sched_yield`` so that other processes
can run. When a node runs more ranks than it has cores (oversubscribed), the communicator
yields after every empty poll: a spinning rank would otherwise hold the core its peer needs.
"""
import os
import time
from typing import Any, Callable, Dict, Generator, List, Optional

Stat = Dict[str, int]
Algorithm = Generator[Any, Optional[bool], Any]

_POLLS_BEFORE_YIELD = 256


def mpi() -> Any:
    """mpi4py's MPI module, imported on first use (importing it initialises MPI)."""
    global _MPI_MODULE
    if _MPI_MODULE is None:
        from mpi4py import MPI
        _MPI_MODULE = MPI
    return _MPI_MODULE


_MPI_MODULE: Any = None


class CommTimeoutError(RuntimeError):
    """A collective did not finish within the communicator's timeout."""


def new_stat() -> Stat:
    """An empty per-collective counter."""
    return {"calls": 0, "bytes_sent": 0, "bytes_recv": 0}


class Channel:
    """The point-to-point messages of one collective call: one tag, byte counters, peers.

    ``header`` bytes of every message (the argument check riding along with the data) are
    counted in ``ctl_stat`` instead of ``stat``, so ``stat`` shows exactly the payload traffic.
    """

    def __init__(self, mpi_comm: Any, rank: int, size: int, tag: int, stat: Stat,
                 header: int = 0, ctl_stat: Optional[Stat] = None) -> None:
        self.comm, self.rank, self.size, self.tag, self.stat = mpi_comm, rank, size, tag, stat
        self.header, self.ctl_stat = header, ctl_stat
        self.peers: List[int] = []  # peers of the posted messages, for timeout messages

    def _count(self, key: str, nbytes: int, peer: int) -> None:
        self.stat[key] += nbytes - self.header
        if self.header:
            self.ctl_stat[key] += self.header
        self.peers.append(peer)

    def isend(self, buf: Any, dest: int) -> Any:
        """Post a nonblocking send of a contiguous numpy buffer."""
        self._count("bytes_sent", buf.nbytes, dest)
        return self.comm.Isend(buf, dest, self.tag)

    def irecv(self, buf: Any, source: int) -> Any:
        """Post a nonblocking receive into a contiguous numpy buffer."""
        self._count("bytes_recv", buf.nbytes, source)
        return self.comm.Irecv(buf, source, self.tag)


def poll(item: Any) -> Optional[bool]:
    """Test ``item`` (requests, or ``(requests, statuses)``) once: None if still in flight,
    else whether a receive was truncated.

    A truncated receive means a peer sent more bytes than this rank expected (mismatched
    arguments).  We finish the remaining requests and report it, so the algorithm can run to the
    end and every rank learns of the mismatch, instead of some ranks raising and others hanging.
    """
    MPI = mpi()
    reqs, statuses = item if isinstance(item, tuple) else (item, None)
    try:
        return False if MPI.Request.Testall(reqs, statuses) else None
    except MPI.Exception as err:
        if err.Get_error_class() not in (MPI.ERR_IN_STATUS, MPI.ERR_TRUNCATE):
            raise
    rest = [r for r in reqs if r != MPI.REQUEST_NULL]
    while rest and poll(rest) is None:
        pass
    return True


def wait(item: Any, timeout: float, describe: Callable[[], str],
         spin: int = _POLLS_BEFORE_YIELD) -> bool:
    """Wait for ``item`` to complete, raising ``CommTimeoutError`` after ``timeout`` seconds;
    after ``spin`` empty polls, give the core away between polls."""
    done = poll(item)
    if done is not None:
        return done
    polls, deadline = 0, time.monotonic() + timeout
    while True:
        done = poll(item)
        if done is not None:
            return done
        polls += 1
        if polls > spin:
            os.sched_yield()  # let a peer sharing our core run (oversubscribed jobs)
        if polls & 63 == 0 and time.monotonic() > deadline:
            raise CommTimeoutError(describe())


def drive(gen: Algorithm, timeout: float, describe: Callable[[], str],
          spin: int = _POLLS_BEFORE_YIELD) -> Any:
    """Run an algorithm generator to completion and return its result."""
    try:
        item = next(gen)
        while True:
            item = gen.send(wait(item, timeout, describe, spin))
    except StopIteration as stop:
        return stop.value


class Work:
    """Handle of a nonblocking collective: ``test()`` makes progress, ``wait()`` returns the result.

    MPI moves messages only while some rank calls into it, so long computations between start and
    ``wait()`` should call ``test()`` now and then to keep a pipelined collective flowing.
    """

    def __init__(self, gen: Algorithm, timeout: float, describe: Callable[[], str],
                 finish: Callable[[Any], Any], spin: int = _POLLS_BEFORE_YIELD) -> None:
        self._gen, self._timeout, self._describe, self._finish = gen, timeout, describe, finish
        self._spin = spin
        self._done, self._result = False, None
        self._advance(None)

    def _advance(self, truncated: Optional[bool]) -> None:
        try:
            self._item = self._gen.send(truncated) if truncated is not None else next(self._gen)
        except StopIteration as stop:
            self._done, self._result = True, self._finish(stop.value)

    def test(self) -> bool:
        """Make progress without blocking; True once the collective has finished."""
        while not self._done:
            truncated = poll(self._item)
            if truncated is None:
                return False
            self._advance(truncated)
        return True

    def is_completed(self) -> bool:
        """True once the collective has finished (does not make progress)."""
        return self._done

    def wait(self) -> Any:
        """Block until the collective finishes (or times out) and return its result."""
        while not self._done:
            self._advance(wait(self._item, self._timeout, self._describe, self._spin))
        return self._result

"""The in-process virtual cluster: run a function on k ranks as threads of this process, one
at a time (``comm/transport/scheduler.py``; docs/parallel.md, "The virtual cluster"). Each rank
starts from the caller's ``process_state.snapshot()`` and keeps its own copy; the caller's is
restored afterwards.
"""
import os
import threading
from typing import Any, Callable, Dict, List, Optional

from .. import numbers as strict
from .. import process_state
from .comm.engine.args import check_timeout
from .comm.engine.communicator import Communicator
from .comm.errors import DeadlockError
from .comm.transport.inprocess import InProcessTransport, Message, World
from .comm.transport.scheduler import CommAbortedError, Scheduler

__all__ = ["run", "Cluster", "RankFailedError", "DeadlockError", "CommAbortedError",
           "Message"]
# What a separate process would have to itself: the scheduler saves it when the baton leaves
# a rank and restores it when it returns.
_PER_RANK = [(process_state.snapshot, process_state.restore)]


class RankFailedError(RuntimeError):
    """A rank of the virtual cluster raised; ``rank`` and ``errors`` (rank -> exception)."""

    def __init__(self, rank: int, errors: Dict[int, BaseException]) -> None:
        first = errors[rank]
        others = "; ".join(f"rank {q}: {type(e).__name__}" for q, e in sorted(errors.items())
                           if q != rank)
        super().__init__(f"rank {rank} raised {type(first).__name__}: {first}"
                         + (f"\n(then {others})" if others else ""))
        self.rank, self.errors = rank, errors


_RUNNING = threading.local()
# One thread per rank: 10**6 ranks started threads until the OS refused ("can't start new
# thread"), leaving those started waiting for ever and the process unable to start another.
MAX_RANKS = 1024


class Cluster:
    """A virtual cluster of ``world_size`` ranks; ``trace=True`` records every message."""

    def __init__(self, world_size: int, timeout: Optional[float] = None,
                 trace: bool = False) -> None:
        # a whole number (2.5 ended in the scheduler's range()) of at most MAX_RANKS threads
        world_size = strict.count_arg(world_size, "virtual cluster world_size", lo=1,
                                      hi=MAX_RANKS)
        self.world_size, self.timeout = world_size, timeout
        self.trace: Optional[List[Message]] = [] if trace else None

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List[Any]:
        """``fn(comm, *args, **kwargs)`` on every rank; the list of per-rank results."""
        if not callable(fn):
            raise TypeError(f"virtual.run: fn must be callable, got {type(fn).__name__}")
        if getattr(_RUNNING, "active", False):
            raise RuntimeError("virtual.run cannot be called from inside a virtual rank")
        k = self.world_size
        sched = Scheduler(k, _PER_RANK)
        caller_state = sched.snapshot()
        world = World(sched, self.trace)
        world.timeout = check_timeout(os.environ.get("NEEDLE_COMM_TIMEOUT", "60"))  \
            if self.timeout is None else check_timeout(self.timeout, "timeout=")
        members = list(range(k))
        results: List[Any] = [None] * k

        def rank_main(r: int) -> None:
            _RUNNING.active = True
            error: Optional[BaseException] = None
            try:
                sched.enter(r)
                comm = Communicator(InProcessTransport(world, ("world",), members, r),
                                    timeout=self.timeout)
                results[r] = fn(comm, *args, **kwargs)
            except BaseException as err:  # noqa: BLE001 (reported in the caller)
                error = err
            sched.finish(r, error)

        threads = [threading.Thread(target=rank_main, args=(r,), daemon=True,
                                    name=f"needle-virtual-rank-{r}") for r in range(k)]
        for t in threads:
            t.start()
        sched.begin()
        try:
            while not sched.done.wait(0.05):  # short waits keep Ctrl-C responsive
                pass
        finally:
            if not sched.done.is_set():  # interrupted: the ranks stop at their next wait
                sched.aborted = (-1, 130)
            sched.restore(caller_state)
        for t in threads:
            t.join()
        if sched.errors:
            raise RankFailedError(_root_cause(sched), dict(sched.errors)) \
                from sched.errors[_root_cause(sched)]
        return results


def _root_cause(sched: Scheduler) -> int:
    """The first rank that failed on its own (not because of a deadlock or an abort)."""
    for r in sched.failure_order:
        if not isinstance(sched.errors[r], (DeadlockError, CommAbortedError)):
            return r
    return sched.failure_order[0]


def run(world_size: int, fn: Callable[..., Any], *args: Any, timeout: Optional[float] = None,
        **kwargs: Any) -> List[Any]:
    """Run ``fn(comm, *args, **kwargs)`` on ``world_size`` in-process ranks; per-rank results.

    ``timeout``: seconds a communication call may wait (default ``NEEDLE_COMM_TIMEOUT``, 60).
    """
    return Cluster(world_size, timeout).run(fn, *args, **kwargs)

"""The in-process transport: the ranks are threads of one process (``needle.parallel.virtual``).

Messages follow MPI's matching rules, so every algorithm runs unchanged. Like MPICH on shared
memory, a message of at most ``EAGER_BYTES`` completes its send at once and a longer one waits
for the receive (rendezvous), so a program that deadlocks under MPI deadlocks here too. ``dup``
and ``split`` derive a child context's id from the parent's and a per-rank counter.
"""
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, NamedTuple, Optional

import numpy as np

from ..errors import CommTimeoutError
from .scheduler import Scheduler

EAGER_BYTES = 64 << 10
ANY = -1  # ANY_SOURCE and ANY_TAG


class Message(NamedTuple):
    """One delivered message: global source and destination ranks, its bytes, its context."""

    src: int
    dst: int
    nbytes: int
    tag: int
    context: tuple


class Status:
    """What a receive got, with mpi4py's accessor names."""

    __slots__ = ("source", "tag", "count")

    def __init__(self) -> None:
        self.source, self.tag, self.count = ANY, ANY, 0

    def Get_source(self) -> int:  # noqa: N802 (mpi4py's name)
        return self.source

    def Get_count(self, datatype: Any = None) -> int:  # noqa: N802
        return self.count


class _Request:
    __slots__ = ("peer", "tag", "data", "done", "truncated", "count", "send")

    def __init__(self, peer: int, tag: int, data: np.ndarray, send: bool) -> None:
        self.peer, self.tag, self.data, self.send = peer, tag, data, send
        self.done = self.truncated = False
        self.count = 0


class _Context:
    """Message queues of one communicator: per destination, unmatched sends and receives."""

    def __init__(self, cid: tuple, members: List[int]) -> None:
        self.cid, self.members = cid, members
        self.unexpected: List[Deque[_Request]] = [deque() for _ in members]
        self.posted: List[List[_Request]] = [[] for _ in members]


class World:
    """The shared state of one virtual cluster: the scheduler, contexts and message trace."""

    def __init__(self, scheduler: Scheduler, trace: Optional[List[Message]] = None) -> None:
        self.sched = scheduler
        self.trace = trace
        self.timeout = float("inf")  # how long a rank may poll alone (set by the cluster)
        self._contexts: Dict[tuple, _Context] = {}

    def context(self, cid: tuple, members: List[int]) -> _Context:
        """The context ``cid``, created by the first member to ask for it."""
        return self._contexts.setdefault(cid, _Context(cid, members))

    def deliver(self, ctx: _Context, send: _Request, recv: _Request, dst: int) -> None:
        """Copy a matched message into its receive buffer and complete both requests."""
        n, m = send.data.nbytes, recv.data.nbytes
        k = min(n, m)
        recv.data[:k] = send.data[:k]
        recv.truncated, recv.count = n > m, k
        recv.peer, recv.tag = send.peer, send.tag
        send.done = recv.done = True
        send.data = None  # the sender may reuse its buffer now
        if self.trace is not None:
            self.trace.append(Message(ctx.members[recv.peer], ctx.members[dst], n, recv.tag,
                                      ctx.cid))
        self.sched.delivered()


class InProcessTransport:
    """One rank's end of one in-process communicator."""

    ANY_SOURCE = ANY
    ANY_TAG = ANY
    byte = None
    tag_ub = (1 << 30) - 1

    def __init__(self, world: World, cid: tuple, members: List[int], rank: int) -> None:
        self.world, self.cid, self.members = world, cid, members
        self.rank, self.size, self.me = rank, len(members), members[rank]
        self._ctx = world.context(cid, members)
        self._children = 0

    def isend(self, buf: np.ndarray, dest: int, tag: int) -> _Request:
        """Post a send: matched at once if the receive is posted, else queued."""
        data = buf.reshape(-1).view(np.uint8)  # C-contiguous: a flat view of its bytes
        req = _Request(self.rank, tag, data, True)
        posted = self._ctx.posted[dest]
        me = self.rank
        for i, recv in enumerate(posted):
            if (recv.peer == ANY or recv.peer == me) and (recv.tag == ANY or recv.tag == tag):
                del posted[i]
                self.world.deliver(self._ctx, req, recv, dest)
                return req
        if data.nbytes <= EAGER_BYTES:  # buffered: the send is complete now
            req.data, req.done = data.copy(), True
        self._ctx.unexpected[dest].append(req)
        return req

    def irecv(self, buf: np.ndarray, source: int, tag: int) -> _Request:
        """Post a receive: matched at once with the earliest queued message that fits."""
        req = _Request(source, tag, buf.reshape(-1).view(np.uint8), False)
        queue = self._ctx.unexpected[self.rank]
        for i, send in enumerate(queue):
            if (source == ANY or source == send.peer) and (tag == ANY or tag == send.tag):
                del queue[i]
                self.world.deliver(self._ctx, send, req, self.rank)
                return req
        self._ctx.posted[self.rank].append(req)
        return req

    def new_status(self) -> Status:
        """A status object for ``poll((requests, statuses))``."""
        return Status()

    def poll(self, item: Any) -> Optional[bool]:
        """None while any request is in flight, else whether a receive was truncated."""
        reqs, statuses = item if isinstance(item, tuple) else (item, ())
        if not all(req.done for req in reqs):
            return None
        for req, st in zip(reqs, statuses):
            if not req.send:
                st.source, st.tag, st.count = req.peer, req.tag, req.count
        return any(req.truncated for req in reqs)

    def wait(self, item: Any, timeout: float, describe: Callable[[], str]) -> bool:
        """Poll; while nothing completes let the other ranks run (deadlock raises at once)."""
        deadline = time.monotonic() + timeout
        done = self.poll(item)
        while done is None:
            if time.monotonic() > deadline:
                raise CommTimeoutError(describe())
            self.world.sched.block(self.me, describe)
            done = self.poll(item)
        return done

    def idle(self) -> None:
        """A nonblocking test found nothing: let the other ranks run."""
        self.world.sched.pause(self.me, self.world.timeout)

    def dup(self) -> "InProcessTransport":
        """A transport on a new context with the same members (collective)."""
        cid = self.cid + (self._children, "dup")
        self._children += 1
        return InProcessTransport(self.world, cid, self.members, self.rank)

    def split(self, color: int, key: int,
              exchange: Callable[[np.ndarray], np.ndarray]) -> "InProcessTransport":
        """The ranks with equal ``color`` ordered by (``key``, rank); ``exchange`` allgathers
        every rank's ``[color, key]`` (collective)."""
        every = exchange(np.array([color, key], dtype=np.int64)).reshape(self.size, 2)
        group = sorted((int(every[q, 1]), q) for q in range(self.size) if every[q, 0] == color)
        ranks = [q for _, q in group]
        cid = self.cid + (self._children, "split", int(color))
        self._children += 1
        return InProcessTransport(self.world, cid, [self.members[q] for q in ranks],
                                  ranks.index(self.rank))

    def free(self) -> None:
        """Nothing to release: a context lives as long as its cluster."""

    def abort(self, code: int) -> None:
        """End every rank of the virtual cluster: they raise ``CommAbortedError``."""
        self.world.sched.abort(self.me, code)

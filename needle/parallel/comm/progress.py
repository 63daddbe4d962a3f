"""Running a collective: point-to-point channels, waiting with a deadline, and async handles.

Every algorithm is a *generator* that posts nonblocking sends and receives (``Channel``) and
``yield``s the requests it must see complete before it can go on. ``drive`` runs it to the end
(blocking calls); ``Work`` keeps it suspended and finishes it in ``wait()`` (``*_async`` calls).
A transport (``transport/mpi.py`` or ``transport/inprocess.py``) has ``isend``, ``irecv``,
``poll(item)`` (None while in flight, else whether a receive was truncated), ``wait(item,
timeout, describe)`` and ``idle()``, so the same generators run over both.
"""
import time
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Callable, Dict, Generator, List, Optional, Protocol, Union

from .errors import CommTimeoutError
from .hosts import where

Stat = Dict[str, int]
Algorithm = Generator[Any, Optional[bool], Any]


if TYPE_CHECKING:  # (names for the ``Transport`` type only)
    from .transport.inprocess import InProcessTransport
    from .transport.mpi import MPITransport
Transport = Union["MPITransport", "InProcessTransport"]


class GroupInfo(Protocol):
    """What a timeout message names: the rank, the group, the deadline and the hosts."""

    rank: int
    size: int
    timeout: float
    nodes: Optional[List[Hashable]]


def stat(stats: Dict[str, Stat], name: str) -> Stat:
    """``stats[name]``: calls, bytes sent and received (made, at zero, on first use)."""
    return stats.setdefault(name, {"calls": 0, "bytes_sent": 0, "bytes_recv": 0})


class Waiting:
    """What a waiting call is doing: ``what()`` for deadlock reports, ``()`` for timeouts."""

    __slots__ = ("group", "name", "seq", "chans")

    def __init__(self, group: GroupInfo, name: str, seq: int, chans: Sequence["Channel"]) -> None:
        self.group, self.name, self.seq, self.chans = group, name, seq, chans

    def what(self) -> str:
        """``allreduce (call #3) on rank 0 of 2, waiting for ranks [1]``."""
        g = self.group
        return (f"{self.name} (call #{self.seq}) on rank {g.rank} of {g.size}, waiting for "
                f"ranks {self._peers()}")

    def __call__(self) -> str:
        g, peers = self.group, self._peers()
        return (f"needle.parallel: {self.name} (call #{self.seq}) on rank {g.rank} of "
                f"{g.size} did not finish within {g.timeout:g} s (NEEDLE_COMM_TIMEOUT); "
                f"waiting for ranks {peers}{where(peers, g.nodes)}")

    def _peers(self) -> List[int]:
        return sorted({q for c in self.chans for q in c.peers[-4:]})


class Channel:
    """The point-to-point messages of one call on one tag: per-call byte and message counts
    (``header`` bytes of each message, the argument check riding along, counted apart)."""

    __slots__ = ("_isend", "_irecv", "rank", "size", "tag", "header", "sent", "recvd",
                 "nsend", "nrecv", "peers")

    def __init__(self, transport: Transport, tag: int, header: int = 0) -> None:
        self._isend, self._irecv = transport.isend, transport.irecv
        self.rank, self.size, self.tag, self.header = transport.rank, transport.size, tag, header
        self.sent = self.recvd = self.nsend = self.nrecv = 0
        self.peers: List[int] = []  # peers of the posted messages, for timeout messages

    def restart(self, tag: int) -> "Channel":
        """This channel for a new call on ``tag``, its counters at zero (cached calls reuse it)."""
        self.tag = tag
        self.sent = self.recvd = self.nsend = self.nrecv = 0
        self.peers.clear()
        return self

    def isend(self, buf: Any, dest: int) -> Any:
        """Post a nonblocking send of a contiguous numpy buffer."""
        self.sent += buf.nbytes
        self.nsend += 1
        self.peers.append(dest)
        return self._isend(buf, dest, self.tag)

    def irecv(self, buf: Any, source: int) -> Any:
        """Post a nonblocking receive into a contiguous numpy buffer."""
        self.recvd += buf.nbytes
        self.nrecv += 1
        self.peers.append(source)
        return self._irecv(buf, source, self.tag)

    def payload(self) -> tuple:
        """(payload bytes sent, payload bytes received, messages sent)."""
        return (self.sent - self.nsend * self.header, self.recvd - self.nrecv * self.header,
                self.nsend)

    def flush(self, stat: Stat, header_stat: Optional[Stat] = None) -> None:
        """Add this channel's payload bytes to ``stat`` (headers to ``header_stat``)."""
        sent, recvd, _ = self.payload()
        stat["bytes_sent"] += sent
        stat["bytes_recv"] += recvd
        if self.header and header_stat is not None:
            header_stat["bytes_sent"] += self.nsend * self.header
            header_stat["bytes_recv"] += self.nrecv * self.header


def drive(gen: Algorithm, transport: Transport, timeout: float,
          describe: Callable[[], str]) -> Any:
    """Run an algorithm generator to completion over ``transport`` and return its result."""
    wait = transport.wait
    try:
        item = next(gen)
        while True:
            item = gen.send(wait(item, timeout, describe))
    except StopIteration as stop:
        return stop.value


class Work:
    """Handle of a nonblocking call: ``test()`` makes progress, ``wait()`` returns the result.

    MPI moves messages only while a rank calls into it: long computations call ``test()`` now
    and then. ``test()`` has ``wait()``'s deadline (docs/reliability.md, "Polling"); ``poll()``
    has none, for a caller (a server's long poll) that bounds its own wait."""

    def __init__(self, gen: Algorithm, transport: Transport, timeout: float,
                 describe: Callable[[], str], finish: Callable[[Any], Any]) -> None:
        self._gen, self._transport, self._timeout = gen, transport, timeout
        self._describe, self._finish = describe, finish
        self._done, self._result = False, None
        self._progress = self._tested = time.monotonic()  # last progress, last test()
        self._advance(None)

    def _advance(self, truncated: Optional[bool]) -> None:
        try:
            self._item = self._gen.send(truncated) if truncated is not None else next(self._gen)
        except StopIteration as stop:
            self._done, self._result = True, self._finish(stop.value)

    def test(self) -> bool:
        """Make progress without blocking; True once finished (with a deadline: see above)."""
        if self.poll():
            return True
        now = time.monotonic()
        if now - self._tested > self._timeout:  # the caller did not poll for that long (it
            self._progress = now  # computed): its peer had no chance to progress, start again
        self._tested = now
        if now - self._progress > self._timeout:
            raise CommTimeoutError(self._describe())
        return False

    def poll(self) -> bool:
        """``test()`` without the deadline: for a long poll whose caller bounds its own wait."""
        while not self._done:
            truncated = self._transport.poll(self._item)
            if truncated is None:
                self._transport.idle()
                return False
            self._advance(truncated)
            self._progress = time.monotonic()
        return True

    def is_completed(self) -> bool:
        """True once the call has finished (does not make progress)."""
        return self._done

    def wait(self) -> Any:
        """Block until the call finishes (or times out) and return its result."""
        wait = self._transport.wait
        while not self._done:
            self._advance(wait(self._item, self._timeout, self._describe))
        return self._result


def start(gen: Algorithm, transport: Transport, timeout: float, describe: Callable[[], str],
          finish: Callable[[Any], Any], block: bool) -> Any:
    """``finish`` of ``gen``'s result, ``gen`` run to the end now (``block``), else a ``Work``."""
    if block:
        return finish(drive(gen, transport, timeout, describe))
    return Work(gen, transport, timeout, describe, finish)

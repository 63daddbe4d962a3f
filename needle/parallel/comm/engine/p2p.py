"""Point-to-point messages between two ranks: ``send``/``recv`` and their nonblocking forms.

    comm.send(x, dest=1, tag=7)                      # blocking (until the receiver has it, or
    y = comm.recv(source=0, tag=7)                   # buffered when small): y is a numpy array
    y, st = comm.recv(comm.ANY_SOURCE, return_status=True)   # st.source, st.tag
    w = comm.isend(x, 1); ...; w.wait()              # Work handles, like the collectives

The receiver need not know the shape or dtype: a 192-byte *header* (tag, sequence number,
shape, dtype) goes on a header context, the payload on a data context tagged with the
per-destination sequence number, so a payload never matches the wrong header. Stats count
headers as ``stats["p2p_header"]``.
"""
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from ..ledger import Ledger, Regions
from ..progress import Algorithm, Channel, GroupInfo, Stat, Transport, Waiting, start, stat
from . import args
from .convert import to_numpy

HEADER_WORDS = 24
MAX_DIMS = 16
ANY_SOURCE = -1  # recv from whichever rank sends first (MPI.ANY_SOURCE)
ANY_TAG = -1  # recv a message with any tag (MPI.ANY_TAG)


class P2PStatus(NamedTuple):
    """Who sent a received message, and with which tag."""

    source: int
    tag: int


def pack_header(x: np.ndarray, tag: int, seq: int) -> np.ndarray:
    """The header of a message carrying ``x``."""
    if x.ndim > MAX_DIMS:
        raise ValueError(f"send: at most {MAX_DIMS} dimensions, not {x.ndim}")
    name = x.dtype.name.encode()
    if x.dtype.hasobject or x.dtype.fields is not None or len(name) > 32:
        raise TypeError(f"send: cannot send arrays of dtype {x.dtype}")
    h = np.zeros(HEADER_WORDS, dtype=np.int64)
    h[0], h[1], h[2], h[3] = tag, seq, x.nbytes, x.ndim
    h[4:4 + x.ndim] = x.shape
    h[20:24] = np.frombuffer(name.ljust(32, b"\0"), dtype=np.int64)
    return h


def unpack_header(h: np.ndarray) -> Tuple[int, int, tuple, np.dtype]:
    """(tag, sequence number, shape, dtype) of a header."""
    name = bytes(h[20:24].view(np.uint8)).rstrip(b"\0").decode()
    try:
        dtype = np.dtype(name)
    except TypeError:  # bfloat16 and friends: needle's dtype table knows them
        from needle.backend_ndarray.dtypes import to_numpy_dtype
        dtype = to_numpy_dtype(name)
    return int(h[0]), int(h[1]), tuple(int(d) for d in h[4:4 + int(h[3])]), dtype


def send_message(hdr: Channel, data: Channel, x: np.ndarray, dest: int) -> Algorithm:
    """Send the header then the payload (``data.tag`` is the sequence number)."""
    header = pack_header(x, hdr.tag, data.tag)
    yield [hdr.isend(header, dest), data.isend(x, dest)]
    return None


def recv_message(hdr: Channel, source: int, data_transport: Transport,
                 x_out: Optional[np.ndarray], status: Any) -> Algorithm:
    """Receive a header from ``source`` (or any) with ``hdr.tag`` (or any), then its payload;
    returns ``(array, P2PStatus, data channel)``."""
    header = np.empty(HEADER_WORDS, dtype=np.int64)
    yield ([hdr.irecv(header, source)], [status])
    source = status.Get_source()
    tag, seq, shape, dtype = unpack_header(header)
    fits = x_out is not None and x_out.shape == shape and x_out.dtype == dtype
    res = x_out if fits else np.empty(shape, dtype=dtype)
    data = Channel(data_transport, seq)
    yield [data.irecv(res, source)]
    if x_out is not None and not fits:
        raise ValueError(f"recv: out= is {x_out.dtype}{x_out.shape} but rank {source} sent "
                         f"{dtype}{shape}")
    return res, P2PStatus(source, tag), data


class PointToPoint:
    """A group's ``send``/``recv`` (a ``Communicator`` holds one): its own header and payload
    contexts and sequence numbers; the group's counters and ledger."""

    def __init__(self, group: GroupInfo, base: Transport, stats: Dict[str, Stat], ledger: Ledger,
                 regions: Regions) -> None:
        self._group, self._stats, self.ledger, self._regions = group, stats, ledger, regions
        self._hdr_t, self._data_t = base.dup(), base.dup()
        self._seq: Dict[int, int] = {}  # the next payload tag for each destination
        self._calls = 0

    def isend(self, a: Any, dest: int, tag: int, label: Optional[str], block: bool) -> Any:
        """Send an array to ``dest``: done when the buffer may be reused (``block``), else a
        ``Work`` (do not modify the array before ``wait()``)."""
        x, _ = to_numpy(a)
        g = self._group
        dest = args.check_rank("send", "dest", dest, g.rank, g.size)
        tag = args.check_tag("send", tag, self._hdr_t.tag_ub, g.rank, g.size, None)
        seq = self._seq.get(dest, 0)
        self._seq[dest] = (seq + 1) % self._data_t.tag_ub
        hdr, data = Channel(self._hdr_t, tag), Channel(self._data_t, seq)
        done = self._book("send", label)

        def body() -> Algorithm:
            yield from send_message(hdr, data, x, dest)
            done(hdr, data, dest)
        return self._start(body(), f"send(dest={dest}, tag={tag})", [hdr, data],
                           lambda r: None, block)

    def irecv(self, source: int, tag: int, out: Optional[np.ndarray], label: Optional[str],
              return_status: bool, block: bool) -> Any:
        """Receive an array from ``source`` (or ``ANY_SOURCE``) with ``tag`` (or ``ANY_TAG``),
        and ``P2PStatus(source, tag)`` with ``return_status``; now (``block``) or a ``Work``."""
        g = self._group
        if source != ANY_SOURCE:
            source = args.check_rank("recv", "source", source, g.rank, g.size)
        tag = args.check_tag("recv", tag, self._hdr_t.tag_ub, g.rank, g.size, ANY_TAG)
        if out is not None:
            args.check_recv_buffer("recv", out, g.rank, g.size)
        src = self._hdr_t.ANY_SOURCE if source == ANY_SOURCE else source
        hdr = Channel(self._hdr_t, self._hdr_t.ANY_TAG if tag == ANY_TAG else tag)
        status = self._hdr_t.new_status()
        done = self._book("recv", label)

        def body() -> Algorithm:
            res, st, data = yield from recv_message(hdr, src, self._data_t, out, status)
            done(hdr, data, st.source)
            return (res, st) if return_status else res
        name = f"recv(source={'any' if source == ANY_SOURCE else source}, " \
               f"tag={'any' if tag == ANY_TAG else tag})"
        return self._start(body(), name, [hdr], lambda r: r, block)

    def _start(self, gen: Algorithm, name: str, chans: List[Channel],
               finish: Callable[[Any], Any], block: bool) -> Any:
        self._calls += 1
        return start(gen, self._hdr_t, self._group.timeout,
                     Waiting(self._group, name, self._calls, chans), finish, block)

    def _book(self, name: str, label: Optional[str]) -> Callable[[Channel, Channel, int], None]:
        """Count the call now; the function returned adds its bytes and ledger record at its end."""
        stat(self._stats, name)["calls"] += 1
        t0 = time.perf_counter() if self.ledger.enabled else None
        label = self._regions.label(label)

        def done(hdr: Channel, data: Channel, peer: int) -> None:
            hdr.flush(stat(self._stats, "p2p_header"))
            data.flush(stat(self._stats, name))
            if t0 is not None:
                sent, recvd, msgs = data.payload()
                self.ledger.add((name, "p2p", label, sent, recvd, msgs + hdr.nsend,
                                 time.perf_counter() - t0, peer))
        return done

"""Latency-bound collectives: recursive doubling, binomial trees, pairwise alltoall.

Following R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 19(1), 2005:

* **Recursive doubling allreduce** (Section 4.4): in step k rank r swaps its whole vector with
  rank ``r XOR 2^k`` and both reduce, so after ``log2 p`` steps everyone has the result.  It sends
  ``N log2 p`` bytes (more than the ring's ``2 N (p-1)/p``) but needs only ``log2 p`` message
  latencies instead of ``2 (p - 1)``, so it wins for small messages.  When p is not a power of
  two, the first ``2 * rem`` ranks first pair up (odd absorbs even), and get the answer back at
  the end.
* **Binomial tree** broadcast and reduce (Sections 4.1 and 4.3): ``log2 p`` rounds; pieces are
  forwarded as soon as they arrive so large broadcasts are pipelined down the tree.
* **Recursive doubling allgather** (Section 4.2, p a power of two): in step k rank r swaps the
  ``2^k`` parts it holds with rank ``r XOR 2^k``; ``(p - 1) N / p`` bytes, as the ring, in
  ``log2 p`` rounds instead of ``p - 1``.
* **Recursive halving reduce-scatter** (Section 4.4, p a power of two, commutative ops): at
  distance ``p/2, ..., 1`` each rank keeps the half of its segments holding its own and sends
  the other half; ``(p - 1) N / p`` bytes, as the ring, in ``log2 p`` rounds.
* **Pairwise exchange alltoall** (Section 4.5): in step i rank r sends to ``r + i`` and receives
  from ``r - i`` (``r XOR i`` when p is a power of two).

The recursive doubling allreduce, allgather and the recursive halving reduce-scatter carry a
16-byte *header* after the data of each message: a hash h of the call's arguments. Each step
compares the partner's header with ours; a different hash, a message of the wrong size or a
partner's ``POISON`` makes ours ``POISON``. Every rank's header reaches every rank as the data
does, so all ranks end with h when all passed the same arguments and with ``POISON`` otherwise,
at no extra message cost. With an empty payload the allreduce is the metadata check beside the
first messages of every other collective (``metadata.py``). The ``*_steps`` function beside each
generator declares what it sends (``steps.Steps``; the headers are not payload).
"""
from typing import Any, List, Optional, Sequence

import numpy as np

from ..progress import Algorithm, Channel
from .reference import UFUNCS, chunk_bounds
from .steps import Steps, segment_bytes

HEADER = 16
POISON = np.iinfo(np.int64).min  # header value meaning "a message had the wrong size"


class RecursiveDoublingBuffers:
    """The buffers of one recursive-doubling allreduce of ``nbytes`` of ``dtype`` with ``op``:
    ``work`` (payload + header, reduced in place) and ``tmp`` (what the partner sent), with
    their views. Made once per (size, dtype, op) and reused by blocking calls, so a small
    allreduce allocates nothing."""

    def __init__(self, nbytes: int, dtype: Any, op: str, transport: Any) -> None:
        hoff = (nbytes + 7) & ~7  # the header's offset after the payload, 8-byte aligned
        self.ufunc = UFUNCS[op]
        self.work = np.empty(hoff + HEADER, dtype=np.uint8)
        self.tmp = np.empty_like(self.work)
        self.data = self.work[:nbytes].view(dtype)
        self.hdr = self.work[hoff:hoff + HEADER].view(np.int64)
        self.tdata = self.tmp[:nbytes].view(dtype)
        self.thdr = self.tmp[hoff:hoff + HEADER].view(np.int64)
        self.statuses = [transport.new_status(), transport.new_status()]
        self.byte = transport.byte
        self.size = self.work.nbytes
        self.header = self.size - nbytes  # bytes of each message that are not payload
        # Python views of the headers: reading one int costs less than a numpy comparison.
        self.hmv, self.thmv = self.hdr.data, self.thdr.data

    def set_header(self, h: int) -> None:
        """Write the call's argument hash ``h`` into the header."""
        self.hmv[0] = self.hmv[1] = h

    def agrees(self) -> bool:
        """After the exchange: did every rank contribute the same hash?"""
        return self.hmv[0] != POISON

    def received_ok(self, truncated: Optional[bool]) -> bool:
        """Did the last receive bring a message of exactly our size?"""
        return not truncated and self.statuses[0].Get_count(self.byte) == self.size

    def combine(self, truncated: Optional[bool]) -> None:
        """Reduce the partner's vector into ours, or poison our header if the partner's differs
        (other arguments, a wrong-size message, or already poisoned): keep going so nobody
        hangs."""
        hmv = self.hmv
        if not self.received_ok(truncated) or self.thmv[0] != hmv[0]:
            hmv[0] = hmv[1] = POISON
        elif hmv[0] != POISON:
            self.ufunc(self.data, self.tdata, out=self.data)


def recursive_doubling_allreduce(ch: Channel, bufs: RecursiveDoublingBuffers) -> Algorithm:
    """Allreduce ``bufs.work`` = payload + header in place; returns ``bufs.work``."""
    p, r = ch.size, ch.rank
    work, tmp, statuses, combine = bufs.work, bufs.tmp, bufs.statuses, bufs.combine
    p2 = 1 << (p.bit_length() - 1)
    rem = p - p2
    if r < 2 * rem and r % 2 == 0:  # fold: hand our vector to r + 1, get the result back
        yield [ch.isend(work, r + 1)]
        truncated = yield ([ch.irecv(work, r + 1)], statuses[:1])
        if not bufs.received_ok(truncated):
            bufs.hmv[0] = bufs.hmv[1] = POISON
        return work
    if r < 2 * rem:
        truncated = yield ([ch.irecv(tmp, r - 1)], statuses[:1])
        combine(truncated)
    newrank = r // 2 if r < 2 * rem else r - rem
    ### BEGIN YOUR SOLUTION (collectives.mpi)
    mask = 1
    while mask < p2:
        newpeer = newrank ^ mask
        peer = 2 * newpeer + 1 if newpeer < rem else newpeer + rem
        truncated = yield ([ch.irecv(tmp, peer), ch.isend(work, peer)], statuses)
        combine(truncated)
        mask <<= 1
    ### END YOUR SOLUTION
    if r < 2 * rem:
        yield [ch.isend(work, r - 1)]
    return work


def recursive_doubling_allreduce_steps(nbytes: int, p: int, *_: int) -> Steps:
    """What ``recursive_doubling_allreduce`` sends: N per round, folds around the exchanges."""
    p2, r = 1 << (p.bit_length() - 1), np.arange(p)
    rem, even = p - p2, r % 2 == 0
    low = r < 2 * rem
    new = np.where(low, np.where(even, -1, r // 2), r - rem)  # -1: folded into r + 1
    rounds = [np.where(new < 0, -1, np.where(q < rem, 2 * q + 1, q + rem))
              for q in (new ^ (1 << k) for k in range(p2.bit_length() - 1))]
    if rem:
        rounds = [np.where(low & even, r + 1, -1)] + rounds + [np.where(low & ~even, r - 1, -1)]
    return Steps.of(np.array(rounds, np.int64).reshape(-1, p), nbytes)


class HeaderBuffers:
    """``work`` (the data, then room for a header), ``tmp`` (``tmp_bytes`` of a partner's data
    and its header) and ``hdr``: our header, the argument hash twice or ``POISON``."""

    def __init__(self, work_bytes: int, tmp_bytes: int, transport: Any) -> None:
        self.work = np.empty(work_bytes + HEADER, dtype=np.uint8)
        self.tmp = np.empty(tmp_bytes + HEADER, dtype=np.uint8)
        self.hdr = np.empty(HEADER, dtype=np.uint8)
        self.hv = self.hdr.view(np.int64)
        self.statuses = [transport.new_status(), transport.new_status()]
        self.byte = transport.byte
        self.header = HEADER  # bytes of each message that are not payload
        self.tmv, self.hmv = self.tmp.data, self.hdr.data

    def set_header(self, h: int) -> None:
        """Write the call's argument hash ``h`` into the header."""
        self.hv[0] = self.hv[1] = h

    def agrees(self) -> bool:
        """After the exchange: did every rank contribute the same hash?"""
        return self.hv[0] != POISON

    def received_ok(self, truncated: Optional[bool], m: int) -> bool:
        """Did ``m`` bytes and a header equal to ours arrive? If not, poison ours (and keep
        going, so that no rank waits for a message that will not come)."""
        ok = not truncated and self.statuses[0].Get_count(self.byte) == m + HEADER
        if not ok or self.tmv[m:m + HEADER] != self.hmv:
            self.hv[0] = self.hv[1] = POISON
            return False
        return self.hv[0] != POISON


class AllgatherBuffers(HeaderBuffers):
    """A recursive-doubling allgather of ``p`` parts of ``nbytes``: ``work`` holds the parts in
    rank order."""

    def __init__(self, nbytes: int, p: int, transport: Any) -> None:
        super().__init__(nbytes * p, nbytes * (p // 2), transport)
        self.part = nbytes


class ReduceScatterBuffers(HeaderBuffers):
    """A recursive-halving reduce-scatter of flat ``dtype`` data cut at item offsets ``b``
    (one segment per rank) with ``op``: ``work`` holds the partial reductions."""

    def __init__(self, b: Sequence[int], dtype: Any, op: str, transport: Any) -> None:
        item = np.dtype(dtype).itemsize
        super().__init__(b[-1] * item, b[-1] * item, transport)
        self.b, self.item, self.ufunc = b, item, UFUNCS[op]
        self.data = self.work[:b[-1] * item].view(dtype)
        self.tdata = self.tmp.view(dtype)
        self.saved = np.empty(HEADER, dtype=np.uint8)


def recursive_doubling_allgather(ch: Channel, bufs: AllgatherBuffers) -> Algorithm:
    """Allgather in place in ``bufs.work`` (rank r's part already at ``r * part``), p a power
    of two; every message is the sender's parts followed by its header. Returns ``bufs.work``."""
    p, r, n = ch.size, ch.rank, bufs.part
    work, tmp, hdr, statuses = bufs.work, bufs.tmp, bufs.hdr, bufs.statuses
    mask = 1
    while mask < p:
        peer, m = r ^ mask, mask * n
        lo, peer_lo = (r & -mask) * n, (peer & -mask) * n  # where each side's parts start
        # The header goes right after our parts: bytes that are not ours yet (the partner's,
        # received into ``tmp`` and copied only after this send, or a later step's).
        work[lo + m:lo + m + HEADER] = hdr
        truncated = yield ([ch.irecv(tmp[:m + HEADER], peer),
                            ch.isend(work[lo:lo + m + HEADER], peer)], statuses)
        if bufs.received_ok(truncated, m):
            work[peer_lo:peer_lo + m] = tmp[:m]
        mask <<= 1
    return work


def recursive_doubling_allgather_steps(nbytes: int, p: int, *_: int) -> Steps:
    """What ``recursive_doubling_allgather`` sends (``nbytes``: the output): 2^k parts."""
    k, r = np.ogrid[:p.bit_length() - 1, :p]
    return Steps.of(r ^ (1 << k), (1 << k) * (nbytes // p))


def recursive_halving_reduce_scatter(ch: Channel, bufs: ReduceScatterBuffers) -> Algorithm:
    """Reduce-scatter in place in ``bufs.data`` (Thakur et al. Section 4.4, p a power of two):
    at distance d = p/2, ..., 1 rank r sends the half of its current segments that rank
    ``r XOR d`` keeps, followed by its header, and reduces the half it keeps with what arrives.
    Rank r ends with segment r (item offsets ``bufs.b``); ``(p - 1) N / p`` bytes sent."""
    p, r = ch.size, ch.rank
    b, item, work, tmp, hdr, saved = bufs.b, bufs.item, bufs.work, bufs.tmp, bufs.hdr, bufs.saved
    data, tdata, ufunc = bufs.data, bufs.tdata, bufs.ufunc
    d = p // 2
    while d >= 1:
        lo = r & -(2 * d)  # our segments this step: lo .. lo + 2d
        keep, give = (lo, lo + d) if r & d == 0 else (lo + d, lo)  # first segment of each half
        k0, k1, g0, g1 = b[keep] * item, b[keep + d] * item, b[give] * item, b[give + d] * item
        # The header goes right after the half we give: 16 bytes that may be the start of the
        # half we keep, saved and put back once the send has completed.
        saved[:] = work[g1:g1 + HEADER]
        work[g1:g1 + HEADER] = hdr
        truncated = yield ([ch.irecv(tmp[:k1 - k0 + HEADER], r ^ d),
                            ch.isend(work[g0:g1 + HEADER], r ^ d)], bufs.statuses)
        work[g1:g1 + HEADER] = saved
        if bufs.received_ok(truncated, k1 - k0):
            mine = data[b[keep]:b[keep + d]]
            ufunc(mine, tdata[:mine.size], out=mine)
        d //= 2
    return data[b[r]:b[r + 1]]


def recursive_halving_reduce_scatter_steps(nbytes: int, p: int, unit: int = 1, *_: int
                                           ) -> Steps:
    """What ``recursive_halving_reduce_scatter`` sends: the half that ``r XOR d`` keeps."""
    b = np.concatenate([[0], np.cumsum(segment_bytes(nbytes, p, unit))])
    d, r = (p // 2) >> np.arange(p.bit_length() - 1)[:, None], np.arange(p)
    give = (r & -(2 * d)) + np.where(r & d, 0, d)
    return Steps.of(r ^ d, b[give + d] - b[give])


def _forwards(vr: Any, p: int) -> Any:
    """Does virtual rank ``vr`` (or each of an array) of a binomial tree on p ranks have
    children?"""
    return (vr % 2 == 0) & (vr + 1 < p) | (vr == 0) & (p > 1)


def binomial_broadcast(ch: Channel, buf: np.ndarray, root: int, chunk: int) -> Algorithm:
    """Binomial-tree broadcast of flat ``buf`` from ``root``, pipelined in pieces.

    Pieces let a rank forward the start of the buffer while the rest is arriving; they only
    pay off on the way to a rank that forwards, or from a rank that is still receiving.  The
    root therefore sends the whole buffer in one message to each child that is a leaf (at 2
    ranks the broadcast is a single message, as MPI's)."""
    p, r = ch.size, ch.rank
    vr = (r - root) % p  # virtual rank: the root is 0
    pieces = [slice(k, min(k + chunk, buf.size)) for k in range(0, buf.size, chunk)]
    mask, parent = 1, None
    while mask < p:
        if vr & mask:
            parent = (vr - mask + root) % p
            break
        mask <<= 1
    children = []
    mask >>= 1
    while mask > 0:
        if vr + mask < p:
            children.append((vr + mask + root) % p)
        mask >>= 1
    sends: List[Any] = []
    if vr == 0:  # leaves below the root get everything at once
        sends = [ch.isend(buf, c) for c in children if not _forwards((c - root) % p, p)]
        children = [c for c in children if _forwards((c - root) % p, p)]
    elif parent == root and not _forwards(vr, p):
        pieces = [slice(0, buf.size)]
    ### BEGIN YOUR SOLUTION (collectives.mpi)
    recvs = [ch.irecv(buf[sl], parent) for sl in pieces] if parent is not None else []
    for k, sl in enumerate(pieces):
        if parent is not None:
            yield [recvs[k]]
        sends.extend(ch.isend(buf[sl], c) for c in children)
    ### END YOUR SOLUTION
    yield sends
    return buf


def binomial_broadcast_steps(nbytes: int, p: int, unit: int = 1, piece: int = 0) -> Steps:
    """What ``binomial_broadcast`` from rank 0 sends (root q: r acts as r - q), in pieces but
    one message from the root to a leaf."""
    r, levels = np.arange(p), (p - 1).bit_length()
    m = 1 << (levels - 1 - np.arange(levels))[:, None]
    child = np.where((r % (2 * m) == 0) & (r + m < p), r + m, -1)
    s = Steps.of(child, nbytes, piece)
    whole = (r == 0) & (child > 0) & ~_forwards(child, p)
    return Steps(s.dst, s.nbytes, np.where(whole, s.nbytes > 0, s.msgs))


def binomial_reduce(ch: Channel, x: np.ndarray, acc: np.ndarray, root: int, op: str,
                    chunk: int, workspace: np.ndarray) -> Algorithm:
    """Binomial-tree reduce of flat ``x`` into ``acc`` on ``root`` (scratch on other ranks)."""
    p, r, ufunc = ch.size, ch.rank, UFUNCS[op]
    vr = (r - root) % p
    pieces = [slice(k, min(k + chunk, x.size)) for k in range(0, x.size, chunk)]
    acc[...] = x
    mask = 1
    ### BEGIN YOUR SOLUTION (collectives.mpi)
    while mask < p:
        if vr & mask:  # our subtree is complete: send it to the parent and stop
            parent = (vr - mask + root) % p
            yield [ch.isend(acc[sl], parent) for sl in pieces]
            break
        if vr + mask < p:
            child = (vr + mask + root) % p
            for sl in pieces:
                tmp = workspace[:sl.stop - sl.start]
                yield [ch.irecv(tmp, child)]
                ufunc(acc[sl], tmp, out=acc[sl])
        mask <<= 1
    ### END YOUR SOLUTION
    return acc


def binomial_reduce_steps(nbytes: int, p: int, unit: int = 1, piece: int = 0) -> Steps:
    """What ``binomial_reduce`` to rank 0 sends (root q: r acts as r - q), in pieces."""
    m, r = 1 << np.arange((p - 1).bit_length())[:, None], np.arange(p)
    return Steps.of(np.where(r % (2 * m) == m, r - m, -1), nbytes, piece)


def pairwise_alltoall(ch: Channel, x: np.ndarray, out: np.ndarray, rows: int,
                      row_size: int) -> Algorithm:
    """Pairwise-exchange alltoall: chunk j (axis 0) of flat ``x`` goes to rank j; rank j's
    chunk r lands in block j of ``out``."""
    p, r = ch.size, ch.rank
    b = chunk_bounds(rows, p)
    mine = (b[r + 1] - b[r]) * row_size

    def chunk_of(j: int) -> np.ndarray:
        return x[b[j] * row_size:b[j + 1] * row_size]

    out[r * mine:(r + 1) * mine] = chunk_of(r)
    pow2 = p & (p - 1) == 0
    for i in range(1, p):
        dest, src = (r ^ i, r ^ i) if pow2 else ((r + i) % p, (r - i) % p)
        yield [ch.irecv(out[src * mine:(src + 1) * mine], src), ch.isend(chunk_of(dest), dest)]
    return out


def pairwise_alltoall_steps(nbytes: int, p: int, unit: int = 1, *_: int) -> Steps:
    """What ``pairwise_alltoall`` sends: one message per round, empty or not."""
    i, r = np.ogrid[1:p, :p]
    dst = r ^ i if p & (p - 1) == 0 else (r + i) % p
    return Steps(dst, segment_bytes(nbytes, p, unit)[dst], np.ones_like(dst))

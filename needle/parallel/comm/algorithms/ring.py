"""Ring reduce-scatter, allgather and allreduce over point-to-point messages.

The schedule is the one of ``reference.py`` (P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce
algorithms for clusters of workstations", JPDC 2009): ``p - 1`` reduce steps then ``p - 1``
gather steps, each rank sending to ``right = r + 1`` and receiving from ``left = r - 1``.

Two refinements make it fast for large messages:

* **Chunking.** Each segment is cut into pieces of ``chunk`` bytes.  A received piece lands in a
  small reusable buffer that stays in cache, and is reduced while the next pieces are arriving.
* **Pipelining.** A piece is forwarded to the right neighbour as soon as it has been reduced,
  without waiting for the whole step to finish, so a piece travels the ring while the rest of its
  segment is still on the way (the "pipelined ring" of Patarasuk & Yuan, Section 4).

Messages between one pair of ranks with one tag stay in order (MPI's non-overtaking rule, kept
by the in-process transport too), so a single tag is enough for all pieces of all steps: each
rank posts its receives in the order its left neighbour posts the sends.  Each function is a
generator (see ``progress.py``): it yields the requests it waits for, and returns its result;
the ``*_steps`` function beside it declares what it sends (``steps.Steps``).
"""
from typing import Any, List, Optional, Sequence

import numpy as np

from ..progress import Algorithm, Channel
from .reference import UFUNCS, chunk_bounds
from .steps import Steps, segment_bytes

DEPTH = 4  # receive buffers in flight per rank during the reduce phase


def _pieces(b: Sequence[int], i: int, p: int, chunk: int) -> List[slice]:
    """Slices of at most ``chunk`` items covering segment ``i % p`` of bounds ``b``."""
    lo, hi = b[i % p], b[i % p + 1]
    return [slice(k, min(k + chunk, hi)) for k in range(lo, hi, chunk)]


def ring_allreduce_naive(ch: Channel, x: np.ndarray, op: str = "sum") -> Algorithm:
    """The textbook ring allreduce of flat ``x`` (one message per step, no pieces): read this
    first; ``ring_allreduce`` below is the same schedule, chunked and pipelined."""
    p, r, ufunc = ch.size, ch.rank, UFUNCS[op]
    out, b = x.copy(), chunk_bounds(x.size, p)
    right, left = (r + 1) % p, (r - 1) % p

    def seg(i: int) -> np.ndarray:
        return out[b[i % p]:b[i % p + 1]]
    ### BEGIN YOUR SOLUTION (collectives.mpi)
    for s in range(p - 1):  # reduce-scatter: send what we summed last, add what arrives
        tmp = np.empty_like(seg(r - s - 1))
        yield [ch.isend(seg(r - s), right), ch.irecv(tmp, left)]
        ufunc(seg(r - s - 1), tmp, out=seg(r - s - 1))
    for s in range(p - 1):  # allgather: rank r now owns segment r + 1; pass them around
        yield [ch.isend(seg(r + 1 - s), right), ch.irecv(seg(r - s), left)]
    ### END YOUR SOLUTION
    return out


def ring_reduce_scatter(ch: Channel, x: np.ndarray, acc: np.ndarray, b: Sequence[int], op: str,
                        shift: int, chunk: int, workspace: np.ndarray,
                        forward_last: bool = False, final: Optional[np.ndarray] = None
                        ) -> Algorithm:
    """Reduce ``x`` (flat) around the ring; rank r ends owning segment ``(r + shift) % p`` of
    ``acc`` (or of ``final``, the segment alone, when given: saves a copy).  With
    ``forward_last`` the finished pieces are also sent right (the first gather step of an
    allreduce).  Returns the pending send requests."""
    p, r, ufunc = ch.size, ch.rank, UFUNCS[op]
    right, left = (r + 1) % p, (r - 1) % p
    tmps = [workspace[k * chunk:(k + 1) * chunk] for k in range(DEPTH)]
    sends: List[Any] = [ch.isend(x[sl], right) for sl in _pieces(b, r - 1 + shift, p, chunk)]
    # Every piece this rank will receive, in arrival order: (step, slice).
    todo = [(s, sl) for s in range(p - 1) for sl in _pieces(b, r - s - 2 + shift, p, chunk)]
    base = b[(r + shift) % p]  # where our own (final) segment starts
    # The first DEPTH receives, one per buffer.
    posted = [ch.irecv(tmp[:sl.stop - sl.start], left) for tmp, (_, sl) in zip(tmps, todo)]
    ### BEGIN YOUR SOLUTION (collectives.mpi)
    for j, (s, sl) in enumerate(todo):
        yield [posted[j]]
        tmp = tmps[j % DEPTH][:sl.stop - sl.start]
        dst = acc[sl] if final is None or s < p - 2 else final[sl.start - base:sl.stop - base]
        ufunc(x[sl], tmp, out=dst)  # local contribution + what the left neighbour summed
        if j + DEPTH < len(todo):  # the buffer is free again: post the receive DEPTH ahead
            nsl = todo[j + DEPTH][1]
            posted.append(ch.irecv(tmps[j % DEPTH][:nsl.stop - nsl.start], left))
        if s < p - 2 or forward_last:  # pipelining: pass the piece on right away
            sends.append(ch.isend(acc[sl], right))
    ### END YOUR SOLUTION
    return sends


def ring_gather(ch: Channel, out: np.ndarray, b: Sequence[int], own: int, chunk: int,
                sends: List[Any], own_sent: bool) -> Algorithm:
    """Circulate the segments around the ring until every rank has all of ``out``; rank r
    starts with segment ``own`` (already sent right if ``own_sent``)."""
    p, r = ch.size, ch.rank
    right, left = (r + 1) % p, (r - 1) % p
    if not own_sent:
        sends = sends + [ch.isend(out[sl], right) for sl in _pieces(b, own, p, chunk)]
    # Gather step s brings segment own - s - 1; receive straight into ``out``.
    todo = [(s, sl) for s in range(p - 1) for sl in _pieces(b, own - s - 1, p, chunk)]
    recvs = [ch.irecv(out[sl], left) for _, sl in todo]
    ### BEGIN YOUR SOLUTION (collectives.mpi)
    for j, (s, sl) in enumerate(todo):
        yield [recvs[j]]
        if s < p - 2:  # forward what just arrived; the last step's pieces stop here
            sends.append(ch.isend(out[sl], right))
    ### END YOUR SOLUTION
    yield sends
    return out


def ring_allreduce(ch: Channel, x: np.ndarray, out: np.ndarray, op: str, chunk: int,
                   workspace: np.ndarray) -> Algorithm:
    """Ring allreduce of flat ``x`` into flat ``out``: reduce-scatter, then allgather."""
    p, r = ch.size, ch.rank
    if p == 1:
        out[...] = x
        return out
    b = chunk_bounds(x.size, p)
    sends = yield from ring_reduce_scatter(ch, x, out, b, op, 1, chunk, workspace, True)
    return (yield from ring_gather(ch, out, b, r + 1, chunk, sends, own_sent=True))


def ring_allreduce_steps(nbytes: int, p: int, unit: int = 1, piece: int = 0) -> Steps:
    """What ``ring_allreduce`` sends: in round j < 2 (p - 1), segment r - j to the right."""
    return Steps.ring(segment_bytes(nbytes, p, unit), 2 * p - 2, 0, piece)


def ring_reduce_scatter_steps(nbytes: int, p: int, unit: int = 1, piece: int = 0) -> Steps:
    """What ``ring_reduce_scatter_full`` sends: in round j < p - 1, segment r - 1 - j."""
    return Steps.ring(segment_bytes(nbytes, p, unit), p - 1, 1, piece)


def ring_gather_steps(nbytes: int, p: int, unit: int = 1, piece: int = 0) -> Steps:
    """What ``ring_gather`` sends (owning segment r): in round j < p - 1, segment r - j."""
    return Steps.ring(segment_bytes(nbytes, p, unit), p - 1, 0, piece)


def ring_allgather_steps(nbytes: int, p: int, unit: int = 1, piece: int = 0) -> Steps:
    """What ``ring_allgather`` sends (``nbytes``: the output): one message at 2 ranks."""
    return ring_gather_steps(nbytes, p, 1, 0 if p == 2 else piece)


def ring_reduce_scatter_full(ch: Channel, x: np.ndarray, acc: np.ndarray, b: Sequence[int], op: str,
                             chunk: int, workspace: np.ndarray, res: np.ndarray) -> Algorithm:
    """Ring reduce-scatter of flat ``x``: rank r's segment r (bounds ``b``) lands in flat
    ``res``; ``acc`` is scratch for the partial sums passing through."""
    if ch.size == 1:
        res[...] = x
        return res
    sends = yield from ring_reduce_scatter(ch, x, acc, b, op, 0, chunk, workspace, final=res)
    yield sends
    return res


def ring_allgather(ch: Channel, x: np.ndarray, out: np.ndarray, chunk: int) -> Algorithm:
    """Ring allgather: flat ``x`` of every rank lands at offset ``rank * x.size`` of ``out``."""
    p, r, n = ch.size, ch.rank, x.size
    b = [i * n for i in range(p + 1)]
    right = (r + 1) % p
    if p == 2:  # nothing is forwarded: one message each way (pieces only pay for pipelining)
        chunk = max(chunk, n)
    # Send our block straight from the input while copying it into place locally.
    sends = [ch.isend(x[k:k + chunk], right) for k in range(0, n, chunk)] if p > 1 else []
    out[r * n:(r + 1) * n] = x
    return (yield from ring_gather(ch, out, b, r, chunk, sends, own_sent=True))

"""What one call of a collective sends from its busiest rank: messages and payload bytes.

Naive first: ``rank_by_rank`` sums what the algorithm ``select.choose`` picks declares it sends
(``select.steps``, the one declaration, beside each algorithm in ``parallel/comm``: a (rounds,
p) table), every rank and every round: O(p^2) for a ring (times in benchmarks/README.md,
"Planner time").

Then ``busiest``, the planner's: the same numbers in closed form, O(1) in p. A planner group is
symmetric: every rank runs the same algorithm on pieces that differ by at most one item (the
first ``N mod p`` of ``chunk_bounds``' segments are one item longer), and one rank is the
busiest in messages and in bytes at once, so it is counted alone. The costs are the textbook
ones (R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 2005, sec. 4), exact to the byte:

  ring (R = 2 (p - 1) rounds for allreduce, p - 1 for allgather and reduce-scatter): in round
      j rank r sends segment r - s - j (mod p) (s: the ring's shift), so each segment
      ``R // p`` times and a window of ``R mod p`` consecutive ones once more; the busiest
      window holds ``min(R mod p, N mod p)`` long segments (allreduce: ``2 (p - 1) / p N``
      bytes when p divides N);
  recursive doubling allreduce: ``log2 p'`` rounds of N bytes (p' the largest power of two
      <= p), one more on the ranks that fold the other ``p - p'`` in and out;
  recursive doubling allgather, recursive halving reduce-scatter (p a power of two): ``log2 p``
      rounds, ``(p - 1) n`` bytes (n: one rank's piece);
  send: one message (one rank sends: the pipeline's stage to the next).

Any other algorithm (none the planner's groups use: they pass no hosts, so never the
hierarchical allreduce) is summed rank by rank, refused above ``RANK_BY_RANK`` ranks.
"""
from functools import lru_cache
from typing import Tuple

import numpy as np

from ..parallel.comm.algorithms.select import choose, steps
from ..parallel.comm.algorithms.steps import Steps

__all__ = ["collective_steps", "rank_by_rank", "busiest", "RANK_BY_RANK"]

# Ranks up to which a collective without a closed form is summed rank by rank (O(p^2) for a ring).
RANK_BY_RANK = 16384


@lru_cache(maxsize=4096)
def collective_steps(name: str, items: int, itemsize: int, p: int, algorithm: str = "auto"
                     ) -> Steps:
    """What one call sends, round by round, by ``algorithm`` (``"auto"``: the one
    ``select.choose`` picks; ``items``: per rank's piece for allgather and reduce_scatter, else
    the whole; ``send``: one message)."""
    n = items * itemsize
    if name == "send":
        return Steps.of([[1, -1]], n)
    if name in ("allgather", "reduce_scatter"):
        return steps(name, algorithm, p * n, p, n if name == "reduce_scatter" else itemsize)
    return steps(name, algorithm, n, p, itemsize)


@lru_cache(maxsize=4096)
def rank_by_rank(name: str, items: int, itemsize: int, p: int, algorithm: str = "auto"
                 ) -> Steps:
    """``collective_steps`` folded into one round: each rank's messages and bytes in all (one
    column per rank; O(rounds x p), a ring's O(p^2))."""
    msgs, nbytes = collective_steps(name, items, itemsize, p, algorithm).per_rank()
    return Steps(np.zeros((1, p), np.int64), nbytes[None, :], msgs[None, :])


def _ring(units: int, unit: int, p: int, rounds: int) -> Tuple[int, int]:
    """(messages, bytes) of the busiest rank of a ring of ``rounds`` rounds over ``units``
    units of ``unit`` bytes cut into p near-equal segments (one message per non-empty one)."""
    q, extra = divmod(units, p)          # segments of q units, the first ``extra`` q + 1
    full, window = divmod(rounds, p)     # every segment ``full`` times, then a window
    long = min(window, extra)            # the busiest window's long segments
    msgs = full * (p if q else extra) + (window if q else long)
    return msgs, unit * (full * units + window * q + long)


def _log2(p: int) -> int:
    return p.bit_length() - 1


def _closed_form(name: str, algorithm: str, n: int, itemsize: int, p: int) -> Tuple[int, int]:
    """(messages, bytes) of the busiest rank; ``n``: bytes of the whole (allreduce) or of one
    rank's piece (allgather, reduce_scatter); KeyError for an algorithm not written here."""
    if name == "allreduce" and algorithm == "ring":
        return _ring(n // itemsize, itemsize, p, 2 * p - 2)
    if name == "allreduce" and algorithm == "recursive_doubling":
        rounds = _log2(p) + ((p & (p - 1)) != 0)  # + the fold in and out when p is not 2^k
        return rounds * (n > 0), rounds * n
    rounds = {("allgather", "ring"): p - 1, ("reduce_scatter", "ring"): p - 1,
              ("allgather", "recursive_doubling"): _log2(p),
              ("reduce_scatter", "recursive_halving"): _log2(p)}[name, algorithm]
    return rounds * (n > 0), (p - 1) * n


def busiest(name: str, items: int, itemsize: int, p: int) -> Steps:
    """``rank_by_rank``'s busiest column (most messages and most bytes) as a one-rank ``Steps``,
    in closed form for the planner's algorithms (module docstring); else ``rank_by_rank``."""
    n = items * itemsize
    if name == "send":
        msgs, nbytes = int(n > 0), n
    elif n == 0:
        msgs, nbytes = 0, 0
    else:
        algorithm = choose(name, n if name == "allreduce" else p * n, p)
        try:
            msgs, nbytes = _closed_form(name, algorithm, n, itemsize, p)
        except KeyError:
            if p > RANK_BY_RANK:
                raise ValueError(f"{name} by {algorithm} on {p} ranks: no closed form, and "
                                 f"summed rank by rank only up to {RANK_BY_RANK} ranks "
                                 "(p^2 sends for a ring)") from None
            return rank_by_rank(name, items, itemsize, p, algorithm)
    return Steps(np.zeros((1, 1), np.int64), np.array([[nbytes]], np.int64),
                 np.array([[msgs]], np.int64))

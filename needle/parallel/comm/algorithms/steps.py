"""What one call of an algorithm sends, round by round: its ``Steps``, declared beside its
generator (``*_steps`` in ``ring.py``, ``latency_bound.py``, ``hierarchical.py``) and read
through ``select.steps`` by the cost models and the planner; tests check it against the ledger.
"""
from typing import Any, NamedTuple, Tuple

import numpy as np

from .reference import chunk_bounds


class Steps(NamedTuple):
    """What one call sends: in round k rank r sends ``nbytes[k, r]`` payload bytes to rank
    ``dst[k, r]`` (-1: nothing) in ``msgs[k, r]`` messages (pieces)."""

    dst: np.ndarray
    nbytes: np.ndarray
    msgs: np.ndarray

    @classmethod
    def of(cls, dst: Any, nbytes: Any, piece: int = 0) -> "Steps":
        """From (rounds, p) destinations and bytes; sends cut in ``piece`` bytes (0: whole)."""
        dst, n = np.broadcast_arrays(np.asarray(dst, np.int64), np.asarray(nbytes, np.int64))
        n = n * (dst >= 0)
        msgs = -(-n // piece) if piece else (n > 0).astype(np.int64)
        return cls(dst, n, msgs)

    @classmethod
    def ring(cls, seg: np.ndarray, rounds: int, shift: int = 0, piece: int = 0) -> "Steps":
        """Round j: r sends segment r - shift - j to r + 1 (views: the planner asks p = 4096)."""
        p, one = len(seg), cls.of((np.arange(len(seg)) + 1) % len(seg), seg, piece)

        def rows(v: np.ndarray) -> np.ndarray:  # v[(r - shift - j) % p] in row j
            ext, k = np.tile(v, 3)[2 * p - shift % p:], v.itemsize
            return np.lib.stride_tricks.as_strided(ext, (rounds, p), (-k, k), writeable=False)
        return cls(np.broadcast_to(one.dst, (rounds, p)), rows(one.nbytes), rows(one.msgs))

    def then(self, other: "Steps") -> "Steps":
        """These rounds followed by ``other``'s."""
        return Steps(*(np.concatenate([a, b]) for a, b in zip(self, other)))

    def per_rank(self) -> Tuple[np.ndarray, np.ndarray]:
        """(messages, payload bytes) each rank sends in all."""
        return self.msgs.sum(axis=0), self.nbytes.sum(axis=0)


def segment_bytes(nbytes: int, p: int, unit: int = 1) -> np.ndarray:
    """Bytes of the p near-equal segments (``chunk_bounds``) of ``nbytes`` cut at ``unit``s."""
    return np.diff(chunk_bounds(nbytes // unit, p)) * unit

"""Many tensors as one flat vector: where each one lies, and the vector cut into equal parts.

DDP's buckets, ZeRO's shards and FSDP's flat parameters lay tensors back to back in ``numel``
elements, padded to ``parts * cols`` (``cols = ceil(numel / parts)``); part r is
``[r cols, (r + 1) cols)``: one row of a reduce-scatter, one rank's shard.
"""
from typing import Any, List, NamedTuple, Sequence, Tuple

import numpy as np

__all__ = ["FlatLayout", "chunk_cols", "Piece", "owned_pieces"]


def chunk_cols(numel: int, parts: int) -> int:
    """Elements per part when ``numel`` elements are padded to a multiple of ``parts``."""
    return -(-numel // parts)


class FlatLayout:
    """Tensors of ``shapes`` back to back in one flat vector, padded to ``parts`` equal parts."""

    def __init__(self, shapes: Sequence[Tuple[int, ...]], parts: int) -> None:
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.offsets = [int(o) for o in np.cumsum([0] + self.sizes)[:-1]]
        self.numel = sum(self.sizes)
        self.parts = parts
        self.cols = chunk_cols(self.numel, parts)

    def views(self, flat: np.ndarray) -> List[np.ndarray]:
        """Each tensor's elements of ``flat``, in its shape (views, no copies)."""
        return [flat[off:off + n].reshape(shape)
                for off, n, shape in zip(self.offsets, self.sizes, self.shapes)]

    def flatten(self, arrays: Sequence[Any], dtype: Any) -> np.ndarray:
        """A new zero-padded flat vector of ``parts * cols`` elements holding ``arrays``."""
        flat = np.zeros(self.parts * self.cols, dtype=dtype)
        for a, off, n in zip(arrays, self.offsets, self.sizes):
            flat[off:off + n] = np.asarray(a).reshape(-1)
        return flat

    def part(self, flat: np.ndarray, r: int) -> np.ndarray:
        """Part ``r`` of the padded flat vector (a view)."""
        return flat[r * self.cols:(r + 1) * self.cols]


class Piece(NamedTuple):
    """Elements ``[start, start + length)`` of parameter ``slot``'s flattened data, held at
    position ``at`` of the owning rank's shard."""

    slot: int
    start: int
    length: int
    at: int


def owned_pieces(sizes: Sequence[int], world: int, rank: int) -> List[Piece]:
    """The pieces of tensors of ``sizes`` (back to back) in part ``rank`` of ``world``: what
    that rank owns under ZeRO (sec. 5), a piece of each parameter straddling it."""
    cols = chunk_cols(sum(sizes), world)
    lo, hi = rank * cols, (rank + 1) * cols
    pieces, offset = [], 0
    for slot, n in enumerate(sizes):
        a, b = max(lo, offset), min(hi, offset + n)
        if a < b:
            pieces.append(Piece(slot, a - offset, b - a, a - lo))
        offset += n
    return pieces

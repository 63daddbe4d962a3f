"""Which rank owns which elements (ZeRO, sec. 5), bucket by bucket: rank r owns
``[r cols, (r + 1) cols)`` of a padded bucket, and a *piece* of each parameter straddling it."""
from typing import List, NamedTuple, Sequence

from ..data_parallel.flat_layout import chunk_cols

__all__ = ["Piece", "chunk_cols", "owned_pieces"]


class Piece(NamedTuple):
    """Elements ``[start, start + length)`` of parameter ``slot``'s flattened data, held at
    position ``at`` of the owning rank's shard."""

    slot: int
    start: int
    length: int
    at: int


def owned_pieces(sizes: Sequence[int], world: int, rank: int) -> List[Piece]:
    """The pieces of a bucket of tensors of ``sizes`` (back to back) that ``rank`` owns."""
    cols = chunk_cols(sum(sizes), world)
    lo, hi = rank * cols, (rank + 1) * cols
    pieces, offset = [], 0
    for slot, n in enumerate(sizes):
        a, b = max(lo, offset), min(hi, offset + n)
        if a < b:
            pieces.append(Piece(slot, a - offset, b - a, a - lo))
        offset += n
    return pieces

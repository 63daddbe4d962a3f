"""Axis bookkeeping shared by the reduction-like ops."""
from typing import Sequence, Tuple, Union

Axes = Union[None, int, Sequence[int]]


def normalize_axes(axes: Axes, ndim: int) -> Tuple[int, ...]:
    """``axes`` (None = all, an int, or a sequence) as sorted non-negative ints, validated."""
    if axes is None:
        return tuple(range(ndim))
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    for ax in axes:
        if not -ndim <= ax < max(ndim, 1):
            raise ValueError(f"axis {ax} is out of range for {ndim} dimensions")
    return tuple(sorted(ax % ndim for ax in axes)) if ndim else ()


def keepdims_shape(shape: Tuple[int, ...], axes: Axes) -> Tuple[int, ...]:
    """``shape`` with the reduced ``axes`` set to 1 (the shape a reduction keeps with keepdims)."""
    reduced = normalize_axes(axes, len(shape))
    return tuple(1 if i in reduced else s for i, s in enumerate(shape))

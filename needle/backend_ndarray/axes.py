"""Axis arguments (``None`` for all, an int, or a sequence): their type and their validation."""
import operator
from typing import Sequence, Tuple, Union, cast

Axes = Union[None, int, Sequence[int]]


def check_axis(axis: int, ndim: int, what: str = "axis") -> int:
    """``axis`` as a non-negative int below ``ndim`` (0 for a 0-d array), validated."""
    try:
        axis = operator.index(axis)
    except TypeError:
        raise TypeError(f"{what}: axis must be an int, got {axis!r}") from None
    if not -ndim <= axis < max(ndim, 1):
        raise ValueError(f"{what}: axis {axis} is out of range for {ndim} dimensions")
    return axis % ndim if ndim else 0


def normalize_axes(axes: Axes, ndim: int, what: str = "axis") -> Tuple[int, ...]:
    """``axes`` as sorted, distinct, non-negative ints (all axes for None; none for a 0-d array)."""
    if axes is None:
        return tuple(range(ndim))
    # a single axis (an int, or anything else check_axis names in its error) becomes a 1-tuple
    seq = axes if isinstance(axes, (tuple, list)) else (cast(int, axes),)
    out = tuple(check_axis(a, ndim, what) for a in seq)
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: repeated axis in {tuple(seq)}")
    return tuple(sorted(out)) if ndim else ()


def keepdims_shape(shape: Tuple[int, ...], axes: Axes) -> Tuple[int, ...]:
    """``shape`` with the reduced ``axes`` set to 1 (the shape a reduction keeps with keepdims)."""
    reduced = normalize_axes(axes, len(shape))
    return tuple(1 if i in reduced else s for i, s in enumerate(shape))

"""Max reduction with its (tie-splitting) gradient."""
from typing import Tuple, Union

from ..autograd import NDArray, Tensor, TensorOp
from ._axes import keepdims_shape, normalize_axes
from .ops_mathematic import broadcast_to, reshape

Axes = Union[None, int, Tuple[int, ...]]

__all__ = ["Max", "max"]


class Max(TensorOp):
    """Max over ``axes``; the gradient is shared equally among tied maxima."""

    def __init__(self, axes: Axes = None, keepdims: bool = False):
        self.axes = (axes,) if isinstance(axes, int) else (None if axes is None else tuple(axes))
        self.keepdims = keepdims

    def compute(self, a: NDArray) -> NDArray:
        return a.max(axis=self.axes, keepdims=self.keepdims)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        a = node.inputs[0]
        shape = a.shape
        kept = keepdims_shape(shape, self.axes)
        data = a.realize_cached_data()
        mask = (data == node.realize_cached_data().reshape(kept).broadcast_to(shape))
        mask = mask.astype(data.dtype)
        count = mask.sum(axis=normalize_axes(self.axes, len(shape)), keepdims=True)
        count = count.broadcast_to(shape)
        share = Tensor.make_const(mask / count)
        return broadcast_to(reshape(out_grad, kept), shape) * share


def max(a: Tensor, axes: Axes = None, keepdims: bool = False) -> Tensor:
    """Max over ``axes`` (all when None)."""
    return Max(axes, keepdims)(a)

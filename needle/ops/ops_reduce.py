"""Reductions: sum, mean and max (whose gradient splits ties equally)."""
import math

from ..autograd import NDArray, Tensor, TensorOp
from ..backend_ndarray.axes import Axes, keepdims_shape, normalize_axes

__all__ = ["Summation", "summation", "mean", "Max", "max"]


def _axes(axes: Axes) -> Axes:
    """None, or ``axes`` as a tuple: a lone axis of any kind (an int, or a 1.0 or '0' that the
    axis check then names) is a 1-tuple, a sequence is a tuple."""
    if axes is None or isinstance(axes, int):
        return (axes,) if axes is not None else None
    if isinstance(axes, (str, bytes)) or not hasattr(axes, "__iter__"):
        return (axes,)  # type: ignore[return-value]
    return tuple(axes)


class Summation(TensorOp):
    """Sum over ``axes``; the gradient broadcasts ``out_grad`` back to the input's shape."""

    def __init__(self, axes: Axes = None, keepdims: bool = False):
        self.axes = _axes(axes)
        self.keepdims = keepdims

    def compute(self, a: NDArray) -> NDArray:
        return a.sum(axis=self.axes, keepdims=self.keepdims)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        """Exercise hw1.ops.summation: out_grad reshaped to ``keepdims_shape(input shape, axes)``
        (1 on the summed axes) and broadcast back to the input's shape (Max's gradient uses this
        too)."""
        ### BEGIN YOUR SOLUTION (hw1.ops.summation)
        shape = node.inputs[0].shape
        kept = keepdims_shape(shape, self.axes)
        return out_grad.reshape(kept).broadcast_to(shape)
        ### END YOUR SOLUTION


def summation(a: Tensor, axes: Axes = None, keepdims: bool = False) -> Tensor:
    """Sum over ``axes`` (all when None)."""
    return Summation(axes, keepdims)(a)


def mean(a: Tensor, axes: Axes = None, keepdims: bool = False) -> Tensor:
    """Mean over ``axes`` (all when None)."""
    count = math.prod(a.shape[ax] for ax in normalize_axes(axes, a.ndim))
    return summation(a, axes, keepdims) / count


class Max(TensorOp):
    """Max over ``axes``; the gradient is shared equally among tied maxima."""

    def __init__(self, axes: Axes = None, keepdims: bool = False):
        self.axes = _axes(axes)
        self.keepdims = keepdims

    def compute(self, a: NDArray) -> NDArray:
        return a.max(axis=self.axes, keepdims=self.keepdims)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        a = node.inputs[0]
        shape = a.shape
        kept = keepdims_shape(shape, self.axes)
        data = a.realize_cached_data()
        mask = (data == node.realize_cached_data().reshape(kept).broadcast_to(shape)
                ).astype(data.dtype)
        count = mask.sum(axis=normalize_axes(self.axes, len(shape)), keepdims=True
                         ).broadcast_to(shape)
        share = Tensor.make_const(mask / count)
        # out_grad spread back over the reduced axes: Summation's gradient (hw1.ops.summation)
        return Summation(self.axes, self.keepdims).gradient(out_grad, node) * share


def max(a: Tensor, axes: Axes = None, keepdims: bool = False) -> Tensor:
    """Max over ``axes`` (all when None)."""
    return Max(axes, keepdims)(a)

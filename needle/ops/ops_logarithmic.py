"""Numerically stable log-sum-exp, log-softmax and softmax.

Over one axis on a device offering the ``logsumexp_rows``/``softmax_rows`` primitives
(``ndl.cuda()``), the forward is one kernel; elsewhere it is composed from NDArray ops.
"""
import math
from typing import Optional

from .. import backend_ndarray as array_api
from ..autograd import NDArray, Tensor, TensorOp
from ..backend_ndarray import fused_ops as fused
from ..backend_ndarray.axes import Axes, keepdims_shape, normalize_axes
from .ops_mathematic import broadcast_to, exp, reshape
from .ops_reduce import summation

__all__ = ["LogSumExp", "logsumexp", "LogSoftmax", "logsoftmax", "Softmax", "softmax"]


def _one_kernel_logsumexp(Z: NDArray, axes: Axes) -> Optional[NDArray]:
    """logsumexp over a single axis by the device's fused primitive; None where it has none."""
    axes = normalize_axes(axes, Z.ndim)
    if len(axes) != 1 or not fused.has_primitive(Z.device, "logsumexp_rows"):
        return None
    return fused.logsumexp(Z, axes[0])


class LogSumExp(TensorOp):
    """log(sum(exp(z), axes)), computed as max + log(sum(exp(z - max)))."""

    def __init__(self, axes: Axes = None):
        self.axes = axes

    def compute(self, Z: NDArray) -> NDArray:
        """Exercise hw2.ops.logsumexp: max + log(sum(exp(Z - max))) over ``self.axes`` (None: all),
        max taken with keepdims; the reduced axes are removed from the result."""
        reduced = normalize_axes(self.axes, Z.ndim)
        if any(Z.shape[i] == 0 for i in reduced):  # log(0): -inf, as PyTorch gives
            shape = tuple(s for i, s in enumerate(Z.shape) if i not in reduced)
            return array_api.full(shape, -math.inf, Z.dtype, Z.device)
        ### BEGIN YOUR SOLUTION (hw2.ops.logsumexp)
        out = _one_kernel_logsumexp(Z, self.axes)  # the device's one kernel, where it has one
        if out is not None:
            return out
        axes = normalize_axes(self.axes, Z.ndim)
        z_max = Z.max(axis=axes, keepdims=True)
        shifted = (Z - z_max.broadcast_to(Z.shape)).exp().sum(axis=axes, keepdims=True)
        out = shifted.log() + z_max
        return out.reshape(tuple(s for i, s in enumerate(Z.shape) if i not in axes))
        ### END YOUR SOLUTION

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        """Exercise hw2.ops.logsumexp: out_grad (broadcast back over the reduced axes) times
        exp(Z - max) / sum(exp(Z - max)); not exp(Z - lse), which rounds badly for large Z."""
        ### BEGIN YOUR SOLUTION (hw2.ops.logsumexp)
        Z = node.inputs[0]
        if Z.size == 0:  # nothing to differentiate (and no max to shift by)
            return Tensor.make_const(array_api.full(Z.shape, 0, Z.dtype, Z.device))
        keep = keepdims_shape(Z.shape, self.axes)
        axes = normalize_axes(self.axes, Z.ndim)
        # softmax as exp(z - max) / sum(exp(z - max)), not exp(z - lse): in float32 near 1e9
        # lse rounds to max and each tied maximum would get weight 1. The max is a constant
        # (softmax does not depend on the shift), so the gradient stays differentiable.
        z_max = Z.realize_cached_data().max(axis=axes, keepdims=True).broadcast_to(Z.shape)
        e = exp(Z - Tensor.make_const(z_max))
        probs = e / broadcast_to(summation(e, axes, keepdims=True), Z.shape)
        return broadcast_to(reshape(out_grad, keep), Z.shape) * probs
        ### END YOUR SOLUTION


def logsumexp(a: Tensor, axes: Axes = None) -> Tensor:
    """Stable log(sum(exp(a))) over ``axes``."""
    return LogSumExp(axes=axes)(a)


class LogSoftmax(TensorOp):
    """z - logsumexp(z) along ``axis`` (the last axis by default, as for logits (N, C))."""

    def __init__(self, axis: int = -1):
        self.axis = axis

    def compute(self, Z: NDArray) -> NDArray:
        """Exercise hw2.ops.logsoftmax: Z - logsumexp(Z) along ``self.axis``, written as
        (Z - max) - log(sum(exp(Z - max))) with the max taken with keepdims (stable)."""
        if Z.size == 0:  # an empty result (no max over a zero-size axis)
            return array_api.full(Z.shape, 0, Z.dtype, Z.device)
        ### BEGIN YOUR SOLUTION (hw2.ops.logsoftmax)
        # (z - max) - log(sum(exp(z - max))), not z - lse: lse near 1e9 in float32 loses the
        # log(sum) term (tied maxima would give log-probabilities 0).
        shifted = Z - Z.max(axis=self.axis, keepdims=True).broadcast_to(Z.shape)
        total = shifted.exp().sum(axis=self.axis, keepdims=True).log()
        return shifted - total.broadcast_to(Z.shape)
        ### END YOUR SOLUTION

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        """Exercise hw2.ops.logsoftmax: out_grad - exp(node) * sum(out_grad) along the axis."""
        ### BEGIN YOUR SOLUTION (hw2.ops.logsoftmax)
        Z = node.inputs[0]
        total = broadcast_to(summation(out_grad, self.axis, keepdims=True), Z.shape)
        return out_grad - exp(node) * total
        ### END YOUR SOLUTION


def logsoftmax(a: Tensor, axis: int = -1) -> Tensor:
    """Log of the softmax along ``axis``."""
    return LogSoftmax(axis)(a)


class Softmax(TensorOp):
    """exp(z - max) / sum(exp(z - max)) along ``axis``."""

    def __init__(self, axis: int = -1):
        self.axis = axis

    def compute(self, Z: NDArray) -> NDArray:
        """One kernel where the device offers ``softmax_rows``, else exp(log-softmax)."""
        if fused.has_primitive(Z.device, "softmax_rows"):
            return fused.softmax(Z, self.axis)
        return LogSoftmax(self.axis).compute(Z).exp()

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        # d softmax: s * (g - sum(g * s))
        dot = summation(out_grad * node, self.axis, keepdims=True)
        return node * (out_grad - broadcast_to(dot, node.shape))


def softmax(a: Tensor, axis: int = -1) -> Tensor:
    """Softmax along ``axis``."""
    return Softmax(axis)(a)

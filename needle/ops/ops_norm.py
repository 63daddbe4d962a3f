"""Layer normalization as one op (Ba, Kiros & Hinton 2016, arXiv:1607.06450).

``nn.LayerNorm1d`` composed from ~20 elementwise ops is the course's exercise; autograd then
records every one of them and backpropagates through each. Here the whole normalization is a
single TensorOp whose backward is one more op, with the textbook gradient (y = xhat * w + b,
xhat = (x - mean) * rstd, g = dy * w):

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw = sum(dy * xhat),  db = sum(dy)

On a device offering the ``layer_norm_fwd``/``layer_norm_bwd`` primitives (``ndl.cuda()``),
both directions run as single fused kernels; elsewhere they are composed from NDArray ops
(``backend_ndarray/fused_ops.py``), which still saves recording and replaying the graph. Limit: the
backward op is not itself differentiable (no double backward; use ``LayerNorm1d(fused=False)``).
"""
from typing import Any, Tuple

from ..autograd import NDArray, Tensor, TensorOp, TensorTupleOp
from ..backend_ndarray import fused_ops as fused
from .ops_tuple import tuple_get_item

__all__ = ["LayerNorm", "LayerNormBackward", "layer_norm", "BatchNorm", "BatchNormBackward"]


class LayerNorm(TensorOp):
    """y = (x - mean) / sqrt(var + eps) * w + b over the last axis; w, b of shape (D,)."""

    def __init__(self, eps: float = 1e-5):
        self.eps = eps
        self.saved: Any = None  # (mean, rstd) of the forward, reused by the backward

    def compute(self, x: NDArray, w: NDArray, b: NDArray) -> NDArray:
        d = x.shape[-1] if x.ndim else None
        if x.ndim == 0 or w.shape != (d,) or b.shape != (d,):
            raise ValueError(f"layer_norm: weight {w.shape} and bias {b.shape} must be ({d},) "
                             f"for input {x.shape}")
        y, mean, rstd = fused.layer_norm(x, w, b, self.eps)
        self.saved = (mean, rstd)
        return y

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        x, w, _ = node.inputs
        grads = LayerNormBackward(*self.saved)(out_grad, x, w)
        return tuple_get_item(grads, 0), tuple_get_item(grads, 1), tuple_get_item(grads, 2)


class LayerNormBackward(TensorTupleOp):
    """(dx, dw, db) of LayerNorm given dy, x, w and the forward's saved mean and rstd."""

    def __init__(self, mean: NDArray, rstd: NDArray):
        self.mean = mean
        self.rstd = rstd

    def compute(self, dy: NDArray, x: NDArray, w: NDArray) -> Tuple[NDArray, NDArray, NDArray]:
        dx, dw, db = fused.layer_norm_backward(dy, x, w, self.mean, self.rstd)
        return dx, dw.astype(w.dtype), db.astype(w.dtype)

    def gradient(self, out_grad: Any, node: Any) -> Any:
        raise NotImplementedError("layer_norm has no double backward; build the layer from "
                                  "elementwise ops (nn.LayerNorm1d(fused=False)) for that")


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """Layer normalization over the last axis of ``x`` with (D,) ``weight`` and ``bias``."""
    return LayerNorm(eps)(x, weight, bias)


class BatchNorm(TensorOp):
    """Training-mode batch norm of (N, C, H, W) x per channel on the device's kernels
    (``fused_ops.batch_norm``, two launches each way): y = (x - mean) * rstd * w + b over
    (N, H, W), biased variance. The new running statistics, (1 - momentum) * running +
    momentum * batch, are left in ``new_running`` for the layer to keep."""

    def __init__(self, running_mean: NDArray, running_var: NDArray, momentum: float,
                 eps: float):
        self.running = (running_mean, running_var)
        self.momentum = momentum
        self.eps = eps
        self.saved: Any = None  # the forward's mean and rstd, for the backward
        self.new_running: Any = None

    def compute(self, x: NDArray, w: NDArray, b: NDArray) -> NDArray:
        y, self.saved, new_mean, new_var = fused.batch_norm(x, w, b, *self.running,
                                                            self.momentum, self.eps)
        self.new_running = (new_mean, new_var)
        return y

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        x, w, _ = node.inputs
        grads = BatchNormBackward(self.saved)(out_grad, x, w)
        return tuple_get_item(grads, 0), tuple_get_item(grads, 1), tuple_get_item(grads, 2)


class BatchNormBackward(TensorTupleOp):
    """(dx, dw, db) of BatchNorm given dy, x, w and the forward's saved statistics."""

    def __init__(self, stats: NDArray):
        self.stats = stats

    def compute(self, dy: NDArray, x: NDArray, w: NDArray) -> Tuple[NDArray, NDArray, NDArray]:
        dx, dw, db = fused.batch_norm_backward(dy, x, w, self.stats)
        return dx, dw.astype(w.dtype), db.astype(w.dtype)

    def gradient(self, out_grad: Any, node: Any) -> Any:
        raise NotImplementedError("the batch-norm kernels have no double backward; set "
                                  "nn.BatchNorm1d.use_kernel = False for that")

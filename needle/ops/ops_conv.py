"""Convolution and its helpers: flip, dilate, undilate, pad, conv (NHWC, via im2col).

The course's ``Conv`` pads, takes im2col windows with ``as_strided``, and differentiates by
dilating, flipping and convolving again. On a device offering the ``conv_im2col`` primitive
(``ndl.cuda()``) the reference runs it as a GPU does instead (``fused_ops.conv2d``): one im2col
kernel with implicit padding and stride and one GEMM forward; backward two GEMMs and one
col2im kernel (``ConvBackward``), with no padded, dilated or flipped copies.
"""
from typing import Any, Optional, Tuple

from .. import backend_ndarray as array_api
from .. import numbers
from ..autograd import NDArray, Tensor, TensorOp, TensorTupleOp
from ..backend_ndarray import fused_ops as fused
from ..backend_ndarray.axes import normalize_axes
from .ops_indexing import get_item
from .ops_mathematic import transpose
from .ops_tuple import tuple_get_item

__all__ = ["Flip", "flip", "Dilate", "dilate", "UnDilate", "undilate", "Pad", "pad", "Conv",
           "conv", "ConvBias", "ConvBackward"]


class Flip(TensorOp):
    def __init__(self, axes: Optional[Tuple[int, ...]] = None):
        self.axes = axes

    def compute(self, a: NDArray) -> NDArray:
        return a.flip(self.axes)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return flip(out_grad, self.axes)


def flip(a: Tensor, axes: Optional[Tuple[int, ...]] = None) -> Tensor:
    """``a`` reversed along ``axes``."""
    return Flip(axes)(a)


class Dilate(TensorOp):
    """Insert ``dilation`` zeros between elements along ``axes``."""

    def __init__(self, axes: Tuple[int, ...], dilation: int):
        if type(dilation) is not int or dilation < 0:  # 1.5 ended deep in NumPy
            dilation = numbers.count_arg(dilation, "dilation", lo=0)
        self.axes = axes
        self.dilation = dilation

    def compute(self, a: NDArray) -> NDArray:
        """Exercise hw4.ops.dilate: a zero array with each axis of ``self.axes`` (dilation + 1)
        times longer, ``a`` written at every (dilation + 1)-th position (setitem on a strided
        view)."""
        ### BEGIN YOUR SOLUTION (hw4.ops.dilate)
        axes = normalize_axes(self.axes, a.ndim)
        step = self.dilation + 1
        shape = tuple(s * step if i in axes else s for i, s in enumerate(a.shape))
        out = array_api.full(shape, 0, dtype=a.dtype, device=a.device)
        out[tuple(slice(None, None, step) if i in axes else slice(None)
                  for i in range(a.ndim))] = a
        return out
        ### END YOUR SOLUTION

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return undilate(out_grad, self.axes, self.dilation)


def dilate(a: Tensor, axes: Tuple[int, ...], dilation: int) -> Tensor:
    """``a`` with ``dilation`` zeros after each element along ``axes``."""
    return Dilate(axes, dilation)(a)


class UnDilate(TensorOp):
    """Keep every (dilation+1)-th element along ``axes`` (the inverse of Dilate)."""

    def __init__(self, axes: Tuple[int, ...], dilation: int):
        if type(dilation) is not int or dilation < 0:
            dilation = numbers.count_arg(dilation, "undilate: dilation", lo=0)
        self.axes = axes
        self.dilation = dilation

    def compute(self, a: NDArray) -> NDArray:
        """Exercise hw4.ops.dilate (with Dilate): a strided slice, made compact."""
        ### BEGIN YOUR SOLUTION (hw4.ops.dilate)
        axes = normalize_axes(self.axes, a.ndim)
        step = self.dilation + 1
        return a[tuple(slice(None, None, step) if i in axes else slice(None)
                       for i in range(a.ndim))].compact()
        ### END YOUR SOLUTION

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        grad = dilate(out_grad, self.axes, self.dilation)
        # when a size was not a multiple of dilation+1 the dilated gradient is too long: trim it
        shape = node.inputs[0].shape
        if grad.shape != shape:
            grad = get_item(grad, tuple(slice(0, s) for s in shape))
        return grad


def undilate(a: Tensor, axes: Tuple[int, ...], dilation: int) -> Tensor:
    """Every (dilation+1)-th element of ``a`` along ``axes``."""
    return UnDilate(axes, dilation)(a)


class Pad(TensorOp):
    """Zero padding: ``axes[i] = (before, after)`` for each axis i."""

    def __init__(self, axes: Tuple[Tuple[int, int], ...]):
        self.axes = tuple((lo, hi) for lo, hi in axes)

    def compute(self, a: NDArray) -> NDArray:
        return a.pad(self.axes)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return get_item(out_grad, tuple(slice(lo, lo + s) for (lo, _), s in
                                        zip(self.axes, node.inputs[0].shape)))


def pad(a: Tensor, axes: Tuple[Tuple[int, int], ...]) -> Tensor:
    """``a`` zero-padded by (before, after) per axis."""
    return Pad(axes)(a)


class Conv(TensorOp):
    """2-D convolution of NHWC input with (K, K, C_in, C_out) weights, by im2col + one matmul."""

    def __init__(self, stride: int = 1, padding: int = 0):
        if type(stride) is not int or type(padding) is not int or stride < 1 or padding < 0:
            stride = numbers.count_arg(stride, "conv: stride", lo=1)  # 1.5 ended deep in NumPy
            padding = numbers.count_arg(padding, "conv: padding", lo=0)
        self.stride = stride
        self.padding = padding

    # the device's conv kernels (fused_ops.conv2d) where offered, taken inside compute's and
    # gradient's answers; False composes them on every device (a double backward needs that)
    use_kernel = True

    def _kernel(self, x: Any, w: Any) -> bool:
        """True when this convolution runs on the device's kernels."""
        return (self.use_kernel and fused.has_primitive(x.device, "conv_im2col")
                and x.dtype == w.dtype)

    def compute(self, A: NDArray, B: NDArray) -> NDArray:
        """Exercise hw4.ops.conv: NHWC input A, weights B (K, K, C_in, C_out) -> (N, H', W', C_out);
        pad H and W by ``padding``, then im2col: ``as_strided`` windows (stride ``stride``),
        compact, one matmul with B reshaped (K*K*C_in, C_out)."""
        if A.ndim != 4 or B.ndim != 4:
            raise ValueError(f"conv expects NHWC input and (K, K, C_in, C_out) weights, got "
                             f"shapes {A.shape} and {B.shape}")
        if A.shape[3] != B.shape[2]:
            raise ValueError(f"conv: input has {A.shape[3]} channels but weights {B.shape} "
                             f"expect {B.shape[2]}")
        ### BEGIN YOUR SOLUTION (hw4.ops.conv)
        if self._kernel(A, B):  # the device's im2col + GEMM
            return fused.conv2d(A, B, None, self.stride, self.padding)
        p, s = self.padding, self.stride
        if p:
            A = A.pad(((0, 0), (p, p), (p, p), (0, 0)))
        A = A.compact()
        N, H, W, C_in = A.shape
        K, K2, _, C_out = B.shape
        if H < K or W < K2:
            raise ValueError(f"conv: kernel {K}x{K2} larger than padded input {H}x{W}")
        out_h, out_w = (H - K) // s + 1, (W - K2) // s + 1
        Ns, Hs, Ws, Cs = A.strides
        cols = A.as_strided((N, out_h, out_w, K, K2, C_in),
                            (Ns, Hs * s, Ws * s, Hs, Ws, Cs)).compact()
        inner = K * K2 * C_in
        out = cols.reshape((N * out_h * out_w, inner)) @ B.compact().reshape((inner, C_out))
        return out.reshape((N, out_h, out_w, C_out))
        ### END YOUR SOLUTION

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tuple[Tensor, Tensor]:
        """Exercise hw4.ops.conv: (grad_X, grad_W) as convolutions: out_grad dilated by stride - 1,
        convolved with the flipped, transposed kernel for X, and X (transposed) convolved with
        out_grad (transposed) for W; trim/pad to X's exact shape."""
        ### BEGIN YOUR SOLUTION (hw4.ops.conv)
        if self._kernel(*node.inputs):  # the device's two GEMMs and col2im
            x, w = node.inputs
            grads = ConvBackward(self.stride, self.padding, x.requires_grad, False)(
                out_grad, x, w)
            return tuple_get_item(grads, 0), tuple_get_item(grads, 1)
        X, W = node.inputs
        K = W.shape[0]
        p, s = self.padding, self.stride
        if s > 1:
            out_grad = dilate(out_grad, (1, 2), s - 1)
            # trailing rows/cols the strided conv never reached still need a (zero) gradient
            need_h = X.shape[1] + 2 * p - K + 1
            need_w = X.shape[2] + 2 * p - W.shape[1] + 1
            out_grad = _fit(out_grad, need_h, need_w)
        w_t = transpose(flip(W, (0, 1)), (2, 3))                     # (K, K, C_out, C_in)
        q = K - 1 - p
        grad_x = conv(out_grad, w_t, padding=max(q, 0))              # (N, H, W, C_in)
        if q < 0:  # padding wider than K - 1: crop the border that only ever saw zeros
            grad_x = get_item(grad_x, (slice(None), slice(-q, q), slice(-q, q)))
        x_t = transpose(X, (0, 3))                                   # (C_in, H, W, N)
        g_t = transpose(transpose(out_grad, (0, 1)), (1, 2))         # (H', W', N, C_out)
        grad_w = conv(x_t, g_t, padding=p)                           # (C_in, K, K, C_out)
        grad_w = transpose(transpose(grad_w, (0, 1)), (1, 2))        # (K, K, C_in, C_out)
        return grad_x, grad_w
        ### END YOUR SOLUTION


def _fit(g: Tensor, h: int, w: int) -> Tensor:
    """Crop or zero-pad axes 1 and 2 of ``g`` to (h, w)."""
    _, gh, gw, _ = g.shape
    if gh > h or gw > w:
        g = get_item(g, (slice(None), slice(0, min(gh, h)), slice(0, min(gw, w))))
        _, gh, gw, _ = g.shape
    if gh < h or gw < w:
        g = pad(g, ((0, 0), (0, h - gh), (0, w - gw), (0, 0)))
    return g


def conv(a: Tensor, b: Tensor, stride: int = 1, padding: int = 1) -> Tensor:
    """2-D convolution, NHWC input and (K, K, C_in, C_out) weights."""
    return Conv(stride, padding)(a, b)


class ConvBias(TensorOp):
    """conv(x, w) + bias (Co,) on the device's kernels (one im2col, one GEMM, one bias add);
    only on a device with the ``conv_im2col`` primitive (nn.Conv checks ``has_primitive``)."""

    def __init__(self, stride: int = 1, padding: int = 0):
        self.stride = stride
        self.padding = padding

    def compute(self, x: NDArray, w: NDArray, bias: NDArray) -> NDArray:
        return fused.conv2d(x, w, bias, self.stride, self.padding)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tuple[Any, ...]:
        x, w, b = node.inputs
        grads = ConvBackward(self.stride, self.padding, x.requires_grad, True)(out_grad, x, w)
        return tuple_get_item(grads, 0), tuple_get_item(grads, 1), tuple_get_item(grads, 2)


class ConvBackward(TensorTupleOp):
    """(dx, dw) or (dx, dw, db) of a convolution by two GEMMs and one col2im kernel
    (``fused_ops.conv2d_backward``); dx is a placeholder (dy) when x needs no gradient."""

    def __init__(self, stride: int, padding: int, need_dx: bool, need_db: bool):
        self.stride = stride
        self.padding = padding
        self.need_dx = need_dx
        self.need_db = need_db

    def compute(self, dy: NDArray, x: NDArray, w: NDArray) -> Tuple[NDArray, ...]:
        dx, dw, db = fused.conv2d_backward(dy, x, w, self.stride, self.padding, self.need_dx,
                                           self.need_db)
        dx = dy if dx is None else dx  # x needs no gradient: autograd drops this partial
        return (dx, dw) if db is None else (dx, dw, db)

    def gradient(self, out_grad: Any, node: Any) -> Any:
        raise NotImplementedError("the conv kernels' backward has no double backward; set "
                                  "ops.Conv.use_kernel = False for that")

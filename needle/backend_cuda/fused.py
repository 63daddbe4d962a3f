"""Fused GPU kernels, each beside the naive version composed from NDArray ops.

Works on NDArrays (duck-typed: this package does not import ``backend_ndarray``). The naive
versions run on any device and are what the fused ones are tested and benchmarked against;
the fused ones need ``ndl.cuda()`` arrays and launch one kernel (two for layer-norm weight
gradients) from ``kernels/{softmax,layernorm,adam,dropout}.cu``.
"""
import math
from typing import Any, Tuple

import numpy as np


def _rows(x: Any, what: str) -> Tuple[Any, int, int]:
    """``x`` compact, as (array, rows, cols) over its last axis; checks it is on cuda."""
    if x.device.name != "cuda":
        raise ValueError(f"{what}: fused kernels need a cuda array, got one on {x.device}")
    if x.dtype not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"{what}: needs a floating dtype, got {x.dtype}")
    xc = x.compact()
    cols = x.shape[-1] if x.ndim else 1
    return xc, (math.prod(x.shape) // cols if cols else 0), cols


def _launch_rows(filename: str, kernel: str, x: Any, rows: int, cols: int, args: tuple) -> None:
    from . import _runtime as rt
    from . import kernels as K
    if rows == 0 or cols == 0:
        return
    idx = x.device.index
    k = rt.kernel(filename, K.typed_name(kernel, x.dtype), x.dtype, idx)
    rt.launch(k, (min(rows, 65535 * 16),), (K.row_block(cols),), args, idx)


def _launch_flat(filename: str, kernel: str, x: Any, n: int, args: tuple) -> None:
    from . import _runtime as rt
    from . import kernels as K
    if n == 0:
        return
    grid, block = K.ewise_launch(n)
    idx = x.device.index
    rt.launch(rt.kernel(filename, K.typed_name(kernel, x.dtype), x.dtype, idx), (grid,),
              (block,), args, idx)


def _new(x: Any, shape: Tuple[int, ...], dtype: Any = None) -> Any:
    return type(x).make(shape, device=x.device, dtype=x.dtype if dtype is None else dtype)


def _acc(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def _last_axis(x: Any, axis: int) -> Tuple[Any, Tuple[int, ...]]:
    """``x`` with ``axis`` moved last, and the permutation that undoes it."""
    axis = axis % x.ndim
    if axis == x.ndim - 1:
        return x, tuple(range(x.ndim))
    order = tuple(i for i in range(x.ndim) if i != axis) + (axis,)
    inverse = tuple(int(i) for i in np.argsort(order))
    return x.permute(order), inverse


# ---------------------------------------------------------------------- softmax / logsumexp
def softmax_naive(x: Any, axis: int = -1) -> Any:
    """softmax along ``axis`` from max, subtract, exp, sum and divide (5+ kernels)."""
    z = (x - x.max(axis=axis, keepdims=True).broadcast_to(x.shape)).exp()
    return z / z.sum(axis=axis, keepdims=True).broadcast_to(x.shape)


def softmax(x: Any, axis: int = -1) -> Any:
    """softmax along ``axis`` in one kernel (online normalizer, arXiv:1805.02867)."""
    xl, inverse = _last_axis(x, axis)
    xc, rows, cols = _rows(xl, "softmax")
    out = _new(xc, xc.shape)
    _launch_rows("softmax.cu", "softmax_rows", xc, rows, cols,
                 (xc._handle.array, out._handle.array, np.int64(rows), np.int64(cols)))
    return out.permute(inverse) if inverse != tuple(range(x.ndim)) else out


def logsumexp_naive(x: Any, axis: int = -1) -> Any:
    """log(sum(exp(x - max))) + max along ``axis`` (the axis is removed)."""
    m = x.max(axis=axis, keepdims=True)
    s = (x - m.broadcast_to(x.shape)).exp().sum(axis=axis, keepdims=True)
    return (s.log() + m).reshape(tuple(d for i, d in enumerate(x.shape) if i != axis % x.ndim))


def logsumexp(x: Any, axis: int = -1) -> Any:
    """logsumexp along ``axis`` in one kernel (the axis is removed)."""
    xl, _ = _last_axis(x, axis)
    xc, rows, cols = _rows(xl, "logsumexp")
    if cols == 0:
        raise ValueError(f"logsumexp over a zero-size axis of shape {x.shape}")
    out = _new(xc, xc.shape[:-1])
    _launch_rows("softmax.cu", "logsumexp_rows", xc, rows, cols,
                 (xc._handle.array, out._handle.array, np.int64(rows), np.int64(cols)))
    return out


# ---------------------------------------------------------------------- layer norm
def layer_norm_naive(x: Any, weight: Any, bias: Any, eps: float = 1e-5
                     ) -> Tuple[Any, Any, Any]:
    """(y, mean, rstd) over the last axis from composed ops, as the course's LayerNorm1d."""
    keep = x.shape[:-1] + (1,)
    cols = x.shape[-1]
    mean = x.sum(axis=-1, keepdims=True) / cols  # (..., 1)
    d = x - mean.broadcast_to(x.shape)
    rstd = ((d * d).sum(axis=-1, keepdims=True) / cols + eps) ** -0.5
    xhat = d * rstd.broadcast_to(x.shape)
    row = (1,) * (x.ndim - 1) + (cols,)
    w, b = weight.reshape(row), bias.reshape(row)
    y = xhat * w.broadcast_to(x.shape) + b.broadcast_to(x.shape)
    return y, mean.reshape(keep[:-1]), rstd.reshape(keep[:-1])


def layer_norm(x: Any, weight: Any, bias: Any, eps: float = 1e-5) -> Tuple[Any, Any, Any]:
    """(y, mean, rstd) over the last axis in one kernel; mean/rstd are float32 (float64)."""
    xc, rows, cols = _rows(x, "layer_norm")
    if weight.shape != (cols,) or bias.shape != (cols,):
        raise ValueError(f"layer_norm: weight {weight.shape} and bias {bias.shape} must be "
                         f"({cols},) for input {x.shape}")
    w, b = weight.astype(x.dtype).compact(), bias.astype(x.dtype).compact()
    y = _new(xc, xc.shape)
    mean, rstd = _new(xc, x.shape[:-1], _acc(x.dtype)), _new(xc, x.shape[:-1], _acc(x.dtype))
    _launch_rows("layernorm.cu", "layernorm_fwd", xc, rows, cols,
                 (xc._handle.array, w._handle.array, b._handle.array, y._handle.array,
                  mean._handle.array, rstd._handle.array, np.int64(rows), np.int64(cols),
                  np.float32(eps)))
    return y, mean, rstd


def layer_norm_backward_naive(dy: Any, x: Any, weight: Any, mean: Any, rstd: Any
                              ) -> Tuple[Any, Any, Any]:
    """(dx, dweight, dbias) of layer_norm from composed ops."""
    cols = x.shape[-1]
    lead = tuple(range(x.ndim - 1))
    col = x.shape[:-1] + (1,)
    r = rstd.reshape(col).broadcast_to(x.shape)
    xhat = (x - mean.reshape(col).broadcast_to(x.shape)) * r
    g = dy * weight.reshape((1,) * (x.ndim - 1) + (cols,)).broadcast_to(x.shape)
    mg = (g.sum(axis=-1, keepdims=True) / cols).broadcast_to(x.shape)
    mgx = ((g * xhat).sum(axis=-1, keepdims=True) / cols).broadcast_to(x.shape)
    dx = r * (g - mg - xhat * mgx)
    return dx, (dy * xhat).sum(axis=lead), dy.sum(axis=lead)


def layer_norm_backward(dy: Any, x: Any, weight: Any, mean: Any, rstd: Any
                        ) -> Tuple[Any, Any, Any]:
    """(dx, dweight, dbias) of layer_norm: one kernel for dx, one (+ a sum) for dw, db."""
    from . import _runtime as rt
    from . import kernels as K
    xc, rows, cols = _rows(x, "layer_norm_backward")
    dyc = dy.astype(x.dtype).compact()
    w = weight.astype(x.dtype).compact()
    mc, rc = mean.compact(), rstd.compact()
    dx = _new(xc, xc.shape)
    args = (dyc._handle.array, xc._handle.array, w._handle.array, mc._handle.array,
            rc._handle.array, dx._handle.array, np.int64(rows), np.int64(cols))
    _launch_rows("layernorm.cu", "layernorm_bwd_dx", xc, rows, cols, args)
    if rows == 0 or cols == 0:
        dw, db = _new(xc, (cols,)), _new(xc, (cols,))
        dw.fill(0)
        db.fill(0)
        return dx, dw, db
    rows_per = max(32, math.ceil(rows / 256))  # about 256 row chunks: partials stay small
    chunks = math.ceil(rows / rows_per)
    idx = x.device.index
    import cupy as cp
    with rt.device(idx):
        dw_part = cp.empty((chunks, cols), dtype=_acc(x.dtype))
        db_part = cp.empty((chunks, cols), dtype=_acc(x.dtype))
        k = rt.kernel("layernorm.cu", K.typed_name("layernorm_bwd_dwdb", x.dtype), x.dtype, idx)
        rt.launch(k, (math.ceil(cols / 256), chunks), (256,),
                  (dyc._handle.array, xc._handle.array, mc._handle.array, rc._handle.array,
                   dw_part, db_part, np.int64(rows), np.int64(cols), np.int64(rows_per)), idx)
        grads = []
        for part in (dw_part, db_part):
            total = _new(xc, (cols,), _acc(x.dtype))
            total._handle.array[...] = part.sum(axis=0)  # (chunks, cols) -> (cols,)
            grads.append(total.astype(x.dtype))
    return dx, grads[0], grads[1]


# ---------------------------------------------------------------------- Adam / AdamW
def adam_update_naive(p: Any, grad: Any, m: Any, v: Any, step: int, lr: float,
                      beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                      weight_decay: float = 0.0, decoupled: bool = False) -> None:
    """One Adam (or AdamW when ``decoupled``) step from composed ops; updates p, m, v in place."""
    w = p.astype(m.dtype)
    g = grad.astype(m.dtype)
    if decoupled:
        w = w - w * (lr * weight_decay)
    else:
        g = g + w * weight_decay
    m_new = m * beta1 + g * (1 - beta1)
    v_new = v * beta2 + g * g * (1 - beta2)
    mhat = m_new / (1 - beta1 ** step)
    vhat = v_new / (1 - beta2 ** step)
    w = w - mhat * lr / (vhat.sqrt() + eps)
    m[...] = m_new
    v[...] = v_new
    p[...] = w.astype(p.dtype)


def adam_update(p: Any, grad: Any, m: Any, v: Any, step: int, lr: float, beta1: float = 0.9,
                beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                decoupled: bool = False) -> None:
    """One fused Adam/AdamW step in place; p, m, v compact, m and v in float32 (float64)."""
    if step < 1:
        raise ValueError(f"adam_update: step counts from 1, got {step}")
    for name, a in (("p", p), ("m", m), ("v", v)):
        if not a.is_compact():
            raise ValueError(f"adam_update: {name} must be compact (it is updated in place)")
    if m.dtype != _acc(p.dtype) or v.dtype != _acc(p.dtype):
        raise TypeError(f"adam_update: m, v must be {_acc(p.dtype)} for {p.dtype} params, "
                        f"got {m.dtype}, {v.dtype}")
    _rows(p, "adam_update")
    g = grad.astype(p.dtype).compact()
    n = p.size
    _launch_flat("adam.cu", "adam_step", p, n,
                 (p._handle.array, g._handle.array, m._handle.array, v._handle.array,
                  np.int64(n), np.float32(lr), np.float32(beta1), np.float32(beta2),
                  np.float32(eps), np.float32(weight_decay), np.float32(1 - beta1 ** step),
                  np.float32(1 - beta2 ** step), np.int32(bool(decoupled))))


# ---------------------------------------------------------------------- dropout
def dropout_naive(x: Any, prob: float) -> Tuple[Any, Any]:
    """(y, mask) with a random array drawn on the host, compared, multiplied and scaled."""
    keep = x.device.rand(*x.shape) >= prob  # NumPy's global RNG, like the course's init.randb
    mask = keep.astype(x.dtype)
    return x * mask / (1 - prob), keep


def dropout(x: Any, prob: float, seed: int, offset: int = 0) -> Tuple[Any, Any]:
    """(y, bool mask) in one kernel; the mask is replayable from (seed, offset)."""
    if not 0 <= prob < 1:
        raise ValueError(f"dropout probability must be in [0, 1), got {prob}")
    xc, _, _ = _rows(x, "dropout")
    y, mask = _new(xc, x.shape), _new(xc, x.shape, "bool")
    n = x.size
    _launch_flat("dropout.cu", "dropout_fwd", xc, n,
                 (xc._handle.array, y._handle.array, mask._handle.array, np.int64(n),
                  np.float32(prob), np.float32(1.0 / (1.0 - prob)),
                  np.uint64(seed % 2 ** 64), np.uint64(offset % 2 ** 64)))
    return y, mask


def dropout_backward(dy: Any, mask: Any, prob: float) -> Any:
    """dx = dy * mask / (1 - prob) in one kernel."""
    dyc, _, _ = _rows(dy, "dropout_backward")
    dx = _new(dyc, dy.shape)
    n = dy.size
    _launch_flat("dropout.cu", "dropout_bwd", dyc, n,
                 (dyc._handle.array, mask.compact()._handle.array, dx._handle.array,
                  np.int64(n), np.float32(1.0 / (1.0 - prob))))
    return dx


def dropout_uniform_reference(seed: int, offset: int, n: int) -> np.ndarray:
    """The uniforms dropout.cu draws, computed with NumPy (SplitMix64), for exact tests."""
    def mix(z: np.ndarray) -> np.ndarray:
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
    with np.errstate(over="ignore"):
        i = np.uint64(offset % 2 ** 64) + np.arange(n, dtype=np.uint64)
        h = mix(np.uint64(seed % 2 ** 64) ^ mix(i))
    return (h >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)

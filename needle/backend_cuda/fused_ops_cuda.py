"""Fused GPU kernels as optional backend primitives on compact flat buffers;
``backend_ndarray.fused_ops`` falls back to composed ops where a device lacks them."""
import math
from typing import Any

import numpy as np

from . import kernel_specs as K

__all__ = ["softmax_rows", "logsumexp_rows", "layer_norm_fwd", "layer_norm_bwd", "adam_update",
           "dropout", "dropout_backward"]


def _acc(val: float, x: Any) -> Any:
    """``val`` as the accumulation-typed scalar (float32, float64 for float64) of ``x``."""
    from . import _runtime as rt
    return rt.scalar_arg(val, x.dtype.name)


def _launch_rows(filename: str, kernel: str, x: Any, rows: int, cols: int, args: tuple) -> None:
    from . import _runtime as rt
    if rows == 0 or cols == 0:
        return
    dt, idx = x.dtype.name, x.device_index
    k = rt.kernel(filename, K.typed_name(kernel, dt), dt, idx)
    rt.launch(k, (min(rows, 65535 * 16),), (K.row_block(cols),), args, idx)


def _launch_flat(filename: str, kernel: str, x: Any, n: int, args: tuple) -> None:
    from . import _runtime as rt
    if n == 0:
        return
    grid, block = K.ewise_launch(n)
    dt, idx = x.dtype.name, x.device_index
    rt.launch(rt.kernel(filename, K.typed_name(kernel, dt), dt, idx), (grid,), (block,), args,
              idx)


def softmax_rows(a: Any, out: Any, rows: int, cols: int) -> None:
    """out = softmax of each of the ``rows`` rows of length ``cols`` (online normalizer)."""
    _launch_rows("softmax.cu", "softmax_rows", a, rows, cols,
                 (a.array, out.array, np.int64(rows), np.int64(cols)))


def logsumexp_rows(a: Any, out: Any, rows: int, cols: int) -> None:
    """out[r] = log(sum(exp(row r))) for ``rows`` rows of length ``cols`` > 0."""
    _launch_rows("softmax.cu", "logsumexp_rows", a, rows, cols,
                 (a.array, out.array, np.int64(rows), np.int64(cols)))


def layer_norm_fwd(x: Any, w: Any, b: Any, y: Any, mean: Any, rstd: Any, rows: int, cols: int,
                   eps: float) -> None:
    """y, mean, rstd of layer norm over rows of length ``cols``; mean, rstd float32 (float64)."""
    _launch_rows("layernorm.cu", "layernorm_fwd", x, rows, cols,
                 (x.array, w.array, b.array, y.array, mean.array, rstd.array, np.int64(rows),
                  np.int64(cols), _acc(eps, x)))


def layer_norm_bwd(dy: Any, x: Any, w: Any, mean: Any, rstd: Any, dx: Any, dw: Any, db: Any,
                   rows: int, cols: int) -> None:
    """dx (x's dtype) and dw, db (the accumulation dtype, like mean) of layer norm."""
    _launch_rows("layernorm.cu", "layernorm_bwd_dx", x, rows, cols,
                 (dy.array, x.array, w.array, mean.array, rstd.array, dx.array,
                  np.int64(rows), np.int64(cols)))
    from . import _runtime as rt
    cp = rt.cp
    idx = x.device_index
    with rt.device(idx):
        if rows == 0 or cols == 0:
            dw.array.fill(0)
            db.array.fill(0)
            return
        rows_per = max(32, math.ceil(rows / 256))  # about 256 row chunks: partials stay small
        chunks = math.ceil(rows / rows_per)
        part = cp.empty(2 * chunks * cols, dtype=dw.array.dtype)  # dw's partials, then db's
        dt = x.dtype.name
        k = rt.kernel("layernorm.cu", K.typed_name("layernorm_bwd_dwdb", dt), dt, idx)
        rt.launch(k, (math.ceil(cols / 256), chunks), (256,),
                  (dy.array, x.array, mean.array, rstd.array, part, part[chunks * cols:],
                   np.int64(rows), np.int64(cols), np.int64(rows_per)), idx)
        grid, block = K.ewise_launch(cols)
        k = rt.kernel("layernorm.cu", K.typed_name("layernorm_bwd_dwdb_sum", dt), dt, idx)
        rt.launch(k, (grid,), (block,), (part, part[chunks * cols:], dw.array, db.array,
                                         np.int64(chunks), np.int64(cols)), idx)


def adam_update(p: Any, g: Any, m: Any, v: Any, lr: float, beta1: float, beta2: float,
                eps: float, weight_decay: float, step: int, decoupled: bool) -> None:
    """One Adam/AdamW step in place on p (with gradient g of p's dtype), m and v (float32,
    float64 for float64 p); 1 - beta is formed here, in double, not from a rounded beta."""
    n = p.size
    hyper = (lr, beta1, 1 - beta1, beta2, 1 - beta2, eps, weight_decay, 1 - beta1 ** step,
             1 - beta2 ** step)
    _launch_flat("adam.cu", "adam_step", p, n,
                 (p.array, g.array, m.array, v.array, np.int64(n),
                  *(_acc(h, p) for h in hyper), np.int32(bool(decoupled))))


def dropout(x: Any, y: Any, mask: Any, prob: float, seed: int, offset: int) -> None:
    """y = x * keep / (1 - prob) and the bool ``mask`` keep, replayable from (seed, offset)."""
    n = x.size
    _launch_flat("dropout.cu", "dropout_fwd", x, n,
                 (x.array, y.array, mask.array, np.int64(n), np.float32(prob),
                  _acc(1.0 / (1.0 - prob), x), np.uint64(seed % 2 ** 64),
                  np.uint64(offset % 2 ** 64)))


def dropout_backward(dy: Any, mask: Any, dx: Any, prob: float) -> None:
    """dx = dy * mask / (1 - prob)."""
    n = dy.size
    _launch_flat("dropout.cu", "dropout_bwd", dy, n,
                 (dy.array, mask.array, dx.array, np.int64(n), _acc(1.0 / (1.0 - prob), dy)))

"""Convolution and batch-norm kernels (kernels/conv.cu, kernels/batchnorm.cu) as optional
backend primitives on flat buffers; ``backend_ndarray.fused_ops`` composes them with the
``matmul`` primitive and falls back to composed NDArray ops on devices without them.

A view is passed as (shape, strides, offset) in elements: kernels read inputs, and write
some outputs, through their strides, so a permuted layout (NHWC seen as NCHW) costs no copy.
"""
import math
from typing import Any, Sequence, Tuple

import numpy as np

from . import _runtime as rt
from . import kernel_specs as K

__all__ = ["conv_im2col", "conv_col2im", "conv_bias_add", "column_sum", "batch_norm_fwd",
           "batch_norm_bwd", "batch_norm_stats_size"]

View = Tuple[Sequence[int], Sequence[int], int]  # (shape, strides, offset)
_CHANNELS, _LANES = 32, 8  # batchnorm.cu's and column_sum's block: 32 channels x 8 row lanes
_ONE_PASS_ROWS = 4096  # column_sum sums at most this many rows in one pass


def _i64(*vals: int) -> Tuple[Any, ...]:
    return tuple(np.int64(v) for v in vals)


def _launch(filename: str, kernel: str, a: Any, grid: Tuple[int, ...], block: Tuple[int, ...],
            args: tuple) -> None:
    dt, idx = rt.DTYPE_NAME[a.dtype], a.device_index
    rt.launch(rt.kernel(filename, K.typed_name(kernel, dt), dt, idx), grid, block, args, idx)


def _flat(filename: str, kernel: str, a: Any, n: int, args: tuple) -> None:
    if n > 0:
        grid, block = K.ewise_launch(n)
        _launch(filename, kernel, a, (grid,), (block,), args)


def _view_args(view: View) -> Tuple[Any, ...]:
    shape, strides, offset = view
    return _i64(*shape, *strides, offset)


def conv_im2col(x: Any, cols: Any, view: View, kernel_hw: Tuple[int, int], stride: int,
                padding: int) -> None:
    """cols (N*Ho*Wo, KH*KW*C) = the windows of the (N, H, W, C) ``view`` of ``x``, zero
    padded by ``padding`` (implicitly), every ``stride``-th position."""
    (n, h, w, c), (kh, kw) = view[0], kernel_hw
    ho, wo = (h + 2 * padding - kh) // stride + 1, (w + 2 * padding - kw) // stride + 1
    _flat("conv.cu", "conv_im2col", x, n * ho * wo * kh * kw * c,
          (x.array, cols.array, *_view_args(view), *_i64(ho, wo, kh, kw, stride, padding)))


def conv_col2im(dcols: Any, dx: Any, view: View, out_hw: Tuple[int, int],
                kernel_hw: Tuple[int, int], stride: int, padding: int) -> None:
    """The (N, H, W, C) ``view`` of ``dx`` = the sum of the windows of dcols (N*Ho*Wo,
    KH*KW*C) over each position: conv_im2col's adjoint."""
    n = math.prod(view[0])
    _flat("conv.cu", "conv_col2im", dcols, n,
          (dcols.array, dx.array, *_view_args(view), *_i64(*out_hw, *kernel_hw, stride,
                                                           padding)))


def conv_bias_add(y: Any, bias: Any, rows: int, cols: int) -> None:
    """y[r, c] += bias[c] in place, y compact (rows, cols)."""
    _flat("conv.cu", "conv_bias_add", y, rows * cols,
          (y.array, bias.array, *_i64(rows, cols)))


def column_sum(a: Any, out: Any, rows: int, cols: int) -> None:
    """out[c] = sum over the rows of compact (rows, cols) ``a``: one launch, or for many rows
    two (chunks of rows summed in the accumulation type, then the chunks)."""
    if cols == 0:
        return
    dt, idx = rt.DTYPE_NAME[a.dtype], a.device_index
    acc, tiles = K.ACC_DTYPE[dt], math.ceil(cols / _CHANNELS)

    def run(src: Any, src_dt: str, dst: Any, dst_dt: str, n: int, per: int) -> None:
        k = rt.kernel("conv.cu", K.pair_name("column_sum", src_dt, dst_dt), dt, idx)
        rt.launch(k, (tiles, math.ceil(n / per) if n else 1), (_CHANNELS, _LANES, 1),
                  (src, dst, *_i64(n, cols, per)), idx)
    if rows <= _ONE_PASS_ROWS:
        run(a.array, dt, out.array, dt, rows, max(rows, 1))
        return
    per = math.ceil(rows / 256)  # about 256 chunks of rows
    chunks = math.ceil(rows / per)
    part_buf = type(a)(chunks * cols, np.dtype(acc), idx)  # from needle's pool
    part = part_buf.array
    run(a.array, dt, part, acc, rows, per)
    run(part, acc, out.array, dt, chunks, chunks)


def _bn_chunks(shape: Sequence[int]) -> Tuple[int, int, int, Tuple[int, int]]:
    """(rows, rows per chunk, chunks, grid) for (N, C, H, W): about 256 row chunks at most."""
    n, c, h, w = shape
    rows = n * h * w
    rows_per = max(8 * _LANES, math.ceil(rows / 256))
    chunks = math.ceil(rows / rows_per)
    return rows, rows_per, chunks, (math.ceil(c / _CHANNELS), chunks)


def _strides(view: View) -> Tuple[Any, ...]:
    return _i64(*view[1], view[2])


def _stats_parts(x_view: View, stats: Any) -> Any:
    """(sizes, chunks, grid, (mean, rstd, partials 1, partials 2)) of a batch-norm launch over
    the (N, C, H, W) view: ``stats`` split as batch_norm_fwd lays it out; None when empty."""
    shape = x_view[0]
    c, hw, width = shape[1], shape[2] * shape[3], shape[3]
    rows, rows_per, chunks, grid = _bn_chunks(shape)
    if rows == 0 or c == 0:
        return None
    st = stats.array
    views = st[:c], st[c:2 * c], st[2 * c:(2 + chunks) * c], st[(2 + chunks) * c:]
    return _i64(c, hw, width, rows, rows_per), chunks, grid, views


def batch_norm_fwd(x: Any, x_view: View, w: Any, b: Any, running_mean: Any, running_var: Any,
                   y: Any, y_view: View, new_mean: Any, new_var: Any, stats: Any,
                   momentum: float, eps: float) -> None:
    """y = (x - mean) * rstd * w + b per channel of the (N, C, H, W) views, statistics over
    (N, H, W); ``stats`` (accumulation dtype) gets [mean, rstd, scratch (2 * chunks * C)];
    new_mean / new_var = (1 - momentum) * running + momentum * (mean, biased var)."""
    parts = _stats_parts(x_view, stats)
    if parts is None:
        return
    sizes, chunks, grid, (mean, rstd, pm, pq) = parts
    _launch("batchnorm.cu", "bn_fwd_partials", x, grid, (_CHANNELS, _LANES, 1),
            (x.array, *_strides(x_view), *sizes, pm, pq))
    _launch("batchnorm.cu", "bn_fwd_apply", x, grid, (_CHANNELS, _LANES, 1),
            (x.array, *_strides(x_view), y.array, *_strides(y_view), w.array, b.array,
             running_mean.array, running_var.array, new_mean.array, new_var.array, *sizes,
             np.int64(chunks), pm, pq, mean, rstd, rt.acc_arg(momentum, x), rt.acc_arg(eps, x)))


def batch_norm_stats_size(shape: Sequence[int]) -> int:
    """Elements of the ``stats`` buffer batch_norm_fwd needs for an (N, C, H, W) input."""
    return (2 + 2 * _bn_chunks(shape)[2]) * shape[1]


def batch_norm_bwd(dy: Any, dy_view: View, x: Any, x_view: View, w: Any, stats: Any,
                   dx: Any, dx_view: View, dw: Any, db: Any) -> None:
    """dx, dw, db of batch_norm_fwd (training statistics) from dy and the forward's stats;
    its scratch part is reused."""
    parts = _stats_parts(x_view, stats)
    if parts is None:
        return
    sizes, chunks, grid, (mean, rstd, p1, p2) = parts
    _launch("batchnorm.cu", "bn_bwd_partials", x, grid, (_CHANNELS, _LANES, 1),
            (dy.array, *_strides(dy_view), x.array, *_strides(x_view), *sizes, mean, rstd, p1,
             p2))
    _launch("batchnorm.cu", "bn_bwd_apply", x, grid, (_CHANNELS, _LANES, 1),
            (dy.array, *_strides(dy_view), x.array, *_strides(x_view), dx.array,
             *_strides(dx_view), w.array, dw.array, db.array, *sizes, np.int64(chunks), mean,
             rstd, p1, p2))

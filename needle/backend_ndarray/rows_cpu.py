"""The CPU backend's row-wise fused primitives: softmax, logsumexp and layer norm, by blocks.

Each runs exactly the NumPy operations of its composed version in ``fused.py``
(``softmax_naive``, ``logsumexp_naive``, ``layer_norm_naive``, ``layer_norm_backward_naive``),
in the same order, but on a block of whole rows at a time (~32K elements), so every
intermediate (x - max, exp, x - mean, x-hat, ...) lives in the cache instead of making a
full pass over memory and a fresh, page-faulted buffer. Rows are independent and each row
is reduced by the same NumPy call, so over the last axis results equal the composed
versions bit for bit (tests/backend_ndarray/test_rows_cpu.py). (A softmax over another axis
is transposed last first, by ``fused.softmax``: its rows are then summed pairwise where the
composed reduction adds sequentially, equal to rounding.) The column sums of layer norm's backward (dweight,
dbias) carry a running row from block to block, so they add the rows in NumPy's order too.

The CUDA backend's versions of these primitives (``backend_cuda/fused.py``) are single
kernels; this is the CPU's equivalent of a fused kernel where the loop body stays NumPy.
"""
from typing import Any, Iterator

import numpy as np

ROW_BLOCK = 32768  # elements per block: a few float32 temporaries of 128 KiB fit in L2


def _blocks(rows: int, cols: int) -> Iterator[slice]:
    step = max(1, ROW_BLOCK // max(cols, 1))
    for s in range(0, rows, step):
        yield slice(s, min(rows, s + step))


def _matrix(a: Any, rows: int, cols: int) -> np.ndarray:
    return a.array[: rows * cols].reshape(rows, cols)


def softmax_rows(a: Any, out: Any, rows: int, cols: int) -> None:
    """out = softmax of each row of ``a`` (rows, cols), as ``softmax_naive``."""
    x, y = _matrix(a, rows, cols), _matrix(out, rows, cols)
    if cols == 0:
        return
    for b in _blocks(rows, cols):
        z = np.exp(x[b] - np.maximum.reduce(x[b], axis=1)[:, None])
        np.true_divide(z, np.add.reduce(z, axis=1)[:, None], out=y[b])


def logsumexp_rows(a: Any, out: Any, rows: int, cols: int) -> None:
    """out[i] = log(sum(exp(row i - max))) + max, as ``logsumexp_naive``."""
    x, y = _matrix(a, rows, cols), out.array[:rows]
    for b in _blocks(rows, cols):
        m = np.maximum.reduce(x[b], axis=1)
        s = np.add.reduce(np.exp(x[b] - m[:, None]), axis=1)
        np.add(np.log(s), m, out=y[b])


def layer_norm_fwd(x: Any, w: Any, b: Any, y: Any, mean: Any, rstd: Any, rows: int,
                   cols: int, eps: float) -> None:
    """y = (x - mean) * rstd * w + b over each row; mean and rstd per row, as
    ``layer_norm_naive``."""
    xm, ym = _matrix(x, rows, cols), _matrix(y, rows, cols)
    wr, br = w.array[:cols], b.array[:cols]
    mu_all, rs_all = mean.array[:rows], rstd.array[:rows]
    for s in _blocks(rows, cols):
        xb = xm[s]
        mu = np.add.reduce(xb, axis=1) / cols
        d = xb - mu[:, None]
        rs = np.power(np.add.reduce(d * d, axis=1) / cols + eps, -0.5)  # as scalar_pow
        np.add((d * rs[:, None]) * wr, br, out=ym[s])
        mu_all[s], rs_all[s] = mu, rs


def layer_norm_bwd(dy: Any, x: Any, w: Any, mean: Any, rstd: Any, dx: Any, dw: Any, db: Any,
                   rows: int, cols: int) -> None:
    """(dx, dweight, dbias) of ``layer_norm_fwd``, as ``layer_norm_backward_naive``."""
    dym, xm, dxm = _matrix(dy, rows, cols), _matrix(x, rows, cols), _matrix(dx, rows, cols)
    wr = w.array[:cols]
    mu_all, rs_all = mean.array[:rows], rstd.array[:rows]
    dw_acc = db_acc = None
    for s in _blocks(rows, cols):
        dyb = dym[s]
        r = rs_all[s][:, None]
        xhat = (xm[s] - mu_all[s][:, None]) * r
        g = dyb * wr
        mg = np.add.reduce(g, axis=1) / cols
        mgx = np.add.reduce(g * xhat, axis=1) / cols
        np.multiply(r, (g - mg[:, None]) - xhat * mgx[:, None], out=dxm[s])
        dw_acc = _column_sum(dw_acc, dyb * xhat)
        db_acc = _column_sum(db_acc, dyb)
    if dw_acc is None:  # no rows
        dw.array[:cols], db.array[:cols] = 0, 0
        return
    dw.array[:cols], db.array[:cols] = dw_acc, db_acc


def _column_sum(running: Any, block: np.ndarray) -> np.ndarray:
    """Sum of the rows so far: NumPy adds the rows of an axis-0 reduction one after another,
    so reducing [running; block] continues the unblocked sum in the same order."""
    if running is None:
        return np.add.reduce(block, axis=0)
    return np.add.reduce(np.concatenate([running[None], block]), axis=0)

"""The CPU row primitives (rows_cpu.py) give the composed versions' results bit for bit."""
import numpy as np
import pytest

import needle as ndl
from needle.backend_ndarray import fused as F
from needle.backend_ndarray import rows_cpu
from needle.backend_ndarray.ndarray import NDArray

# several blocks per call, a short last block, one row, one column
SHAPES = [(3000, 37), (700, 256), (5, 128), (1, 7), (9, 1), (2, 3, 50000)]


def _nd(shape, dtype, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    return NDArray((scale * rng.standard_normal(shape)).astype(dtype), dtype=dtype)


def test_the_cpu_offers_the_row_primitives():
    for name in ("softmax_rows", "logsumexp_rows", "layer_norm_fwd", "layer_norm_bwd"):
        assert F.has_primitive(ndl.cpu(), name), name


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_softmax_and_logsumexp_equal_the_composed_ops(shape, dtype):
    x = _nd(shape, dtype)
    np.testing.assert_array_equal(F.softmax(x, -1).numpy(), F.softmax_naive(x, -1).numpy())
    np.testing.assert_array_equal(F.logsumexp(x, -1).numpy(),
                                  F.logsumexp_naive(x, -1).numpy())
    if len(shape) > 1:  # another axis: fused.softmax transposes it last, and then a row is
        # summed pairwise where the composed reduction over axis 0 adds sequentially
        tol = 3e-5 if dtype == "float32" else 1e-13  # 3000-term sums, two orders
        np.testing.assert_allclose(F.softmax(x, 0).numpy(), F.softmax_naive(x, 0).numpy(),
                                   rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_layer_norm_forward_and_backward_equal_the_composed_ops(shape, dtype):
    cols = shape[-1]
    x, dy = _nd(shape, dtype, 1), _nd(shape, dtype, 2)
    w, b = _nd((cols,), dtype, 3), _nd((cols,), dtype, 4)
    fused = F.layer_norm(x, w, b, 1e-5)
    naive = F.layer_norm_naive(x, w, b, 1e-5)
    for got, want in zip(fused, naive):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    _, mean, rstd = naive
    got = F.layer_norm_backward(dy, x, w, mean, rstd)
    want = F.layer_norm_backward_naive(dy, x, w, mean, rstd)
    for g, e, name in zip(got, want, ("dx", "dweight", "dbias")):
        np.testing.assert_array_equal(g.numpy(), e.numpy(), err_msg=name)


def test_column_sums_continue_numpys_order_across_blocks():
    """dbias over many blocks: the bits of one NumPy reduction over all rows (a blockwise
    sum of block sums would differ in the last bits)."""
    rng = np.random.default_rng(5)
    rows = np.float32(1e4) * rng.standard_normal((20000, 3)).astype(np.float32)
    run = None
    for s in range(0, rows.shape[0], 999):
        run = rows_cpu._column_sum(run, rows[s:s + 999])
    np.testing.assert_array_equal(run, np.add.reduce(rows, axis=0))
    blockwise = sum(np.add.reduce(rows[s:s + 999], axis=0) for s in range(0, 20000, 999))
    assert not np.array_equal(blockwise, run)  # the test can tell the two orders apart


def test_softmax_of_rows_with_no_columns_is_empty():
    x = NDArray(np.zeros((3, 0), np.float32))
    assert F.softmax(x, -1).shape == (3, 0)

"""CPU-side logic of the CUDA backend: instantiation names and launch shapes (no GPU needed)."""
import math

import numpy as np
import pytest

from needle.backend_cuda import kernel_specs as K
from needle.backend_ndarray import primitives as P


@pytest.mark.parametrize("n", [1, 255, 256, 257, 10**6, 2**40])
def test_ewise_launch_covers_n(n):
    grid, block = K.ewise_launch(n)
    assert block % 32 == 0 and 1 <= grid <= 65536
    assert grid == min(math.ceil(n / block), 65536)  # grid-stride loop covers the rest


def test_ewise_launch_rejects_empty():
    with pytest.raises(ValueError):
        K.ewise_launch(0)


@pytest.mark.parametrize("cols", [1, 3, 31, 32, 33, 1000, 4096, 10**6])
def test_row_block_is_warp_multiple(cols):
    b = K.row_block(cols)
    assert 32 <= b <= 1024 and b % 32 == 0 and (b & (b - 1)) == 0
    assert b >= min(1024, math.ceil(cols / 4)) or b == 32


@pytest.mark.parametrize("rows,size", [(1, 1), (1, 7), (1, 10**8), (3, 5000), (4096, 4096),
                                       (10**6, 3), (10**6, 32), (10**6, 33), (7, 2**20)])
def test_reduce_launch_partitions_each_row(rows, size):
    launch = K.reduce_launch(rows, size, num_sms=132)
    assert launch["block"] % 32 == 0 and launch["block"] <= 1024
    if launch["kind"] == "thread":
        assert size <= 32 and launch["chunks"] == 1
        return
    # chunks of `chunk` elements cover the row exactly, none empty
    assert launch["chunk"] * launch["chunks"] >= size > launch["chunk"] * (launch["chunks"] - 1)
    assert 1 <= launch["chunks"] <= 65535 and 1 <= launch["grid_rows"] <= rows
    if rows == 1 and size >= 10**6:
        assert launch["chunks"] > 1  # one long row must not run on a single block
    if launch["chunks"] > 1:  # the second pass must not split again
        assert K.reduce_launch(rows, launch["chunks"], 132)["chunks"] == 1


@pytest.mark.parametrize("mode", ["naive", "tiled"])
@pytest.mark.parametrize("batch,m,p", [(1, 1, 1), (3, 129, 127), (2, 4096, 8192)])
def test_matmul_launch_covers_output(mode, batch, m, p):
    (gx, gy, gz), (bx, by, bz) = K.matmul_launch(batch, m, p, mode)
    assert gz == batch
    if mode == "naive":
        assert gx * bx >= p and gy * by >= m
    else:
        bm, bn = K.MATMUL_TILE
        assert bx * by * bz == 256 and gx * bn >= p and gy * bm >= m
        assert (gx - 1) * bn < p and (gy - 1) * bm < m


def test_view_meta_layout_and_limits():
    assert K.view_meta((2, 3), (1, 2), 5) == [2, 5, 2, 3, 1, 2]
    assert K.view_meta((), (), 4) == [0, 4]
    with pytest.raises(ValueError, match="at most"):
        K.view_meta((1,) * 33, (1,) * 33, 0)
    with pytest.raises(ValueError):
        K.view_meta((2,), (1, 1), 0)


def _strided_index(i, shape, strides, offset):
    """Python transcription of strided_index in kernels/strided.cu."""
    idx = offset
    for s, st in zip(reversed(shape), reversed(strides)):
        idx += (i % s) * st
        i //= s
    return idx


def test_strided_index_arithmetic_matches_numpy():
    base = np.arange(4 * 5 * 6 * 7)
    a = base.reshape(4, 5, 6, 7)
    view = a.transpose(2, 0, 3, 1)[1:, ::2, ::-3, 1:4]
    item = base.itemsize
    strides = tuple(s // item for s in view.strides)
    offset = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // item
    got = [base[_strided_index(i, view.shape, strides, offset)] for i in range(view.size)]
    np.testing.assert_array_equal(got, view.reshape(-1))


def test_name_expressions_cover_every_dtype_and_op():
    names = K.name_expressions("ewise.cu")
    for dt in K.FLOAT_DTYPES:
        for op in P.EWISE_BINARY:
            assert K.binary_name(op, dt) in names and K.binary_name(op, dt, True) in names
        for op in P.EWISE_UNARY:
            assert K.unary_name(op, dt) in names
        assert set(K.name_expressions("ewise.cu", dt)) <= set(names)
    assert K.binary_name("lt", "float16") == "ewise_binary<__half, bool, ndl::Lt>"
    assert K.strided_name("compact", 2) == "compact<unsigned short>"
    for f in K.KERNEL_FILES:
        assert K.name_expressions(f) and "(" not in "".join(K.name_expressions(f))

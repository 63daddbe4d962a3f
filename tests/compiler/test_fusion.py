"""The fusion pass never inlines a chain across an in-place write to one of its inputs.

Inlining ``t = x * 2`` into its reader ``t + 1`` moves the read of ``x`` to the reader's
position; if ``x`` is overwritten in between (``x[:] = y``, a partial ``x[2:4] = ...``), the
fused kernel would read the new values. Each case runs in a ``lazy`` block (the temporary is
deleted so that nothing but the version check keeps it unfused) and is compared with NumPy;
the same chain without the write must fuse, so the check is not vacuous.
"""
import numpy as np
import pytest

import needle as ndl

N = 6


def _chain(write, unary):
    """x * 2 (then exp), an optional write, then + 1; (result, lazy block, the x it used)."""
    with ndl.lazy() as lz:
        x = ndl.NDArray(np.arange(float(N)))
        y = ndl.NDArray(np.full(N, 3.0))
        t = x * 2.0
        if unary:
            t = t.exp()
        write(x, y)
        out = t + 1.0
        del t  # nothing outside the block holds the temporary: only the write stops fusion
    return out.numpy(), lz


def _whole(x, y):
    x[:] = y


def _part(x, y):
    x[2:4] = y[0:2]


def _scalar(x, y):
    x[1:5] = 7.0


def _other(x, y):
    y[:] = x  # writes y, which the chain does not read: fusing stays correct


def _nothing(x, y):
    pass


@pytest.mark.parametrize("unary", [False, True], ids=["mul-add", "mul-exp-add"])
@pytest.mark.parametrize("write", [_whole, _part, _scalar], ids=["whole", "part", "scalar"])
def test_no_fusion_across_a_write_to_an_input(write, unary):
    got, lz = _chain(write, unary)
    t = np.arange(float(N)) * 2.0
    np.testing.assert_array_equal(got, (np.exp(t) if unary else t) + 1.0)
    after = lz.explain().split("== after fusion")[1]
    assert "+s_add]" not in after, after  # the reader runs alone (x * 2 may fuse with exp)


@pytest.mark.parametrize("write", [_nothing, _other], ids=["no-write", "write-elsewhere"])
def test_the_same_chain_fuses_without_that_write(write):
    got, lz = _chain(write, True)
    np.testing.assert_allclose(got, np.exp(np.arange(float(N)) * 2.0) + 1.0, rtol=1e-15)
    after = lz.explain().split("== after fusion")[1]
    assert "fused[s_mul+exp+s_add]" in after, after


def test_compiled_function_writing_an_input_in_place_equals_eager():
    """Under ``ndl.compile`` (record, then replay): a chain, a write into the input, then
    the chain's reader; every replay must read the input's old values."""
    def f(x, y):
        t = (x * 2.0).exp()
        x.realize_cached_data()[:] = y.realize_cached_data()  # in place, inside the trace
        return t + 1.0

    cf = ndl.compile(f)
    for k in range(3):
        base = np.arange(float(N)) + k
        x = ndl.Tensor(base.copy(), requires_grad=False)
        y = ndl.Tensor(np.full(N, -1.0), requires_grad=False)
        np.testing.assert_allclose(cf(x, y).numpy(), np.exp(base * 2.0) + 1.0, rtol=1e-15)
        np.testing.assert_array_equal(x.numpy(), np.full(N, -1.0))


def test_no_fusion_of_two_strided_shapes():
    """A producer iterating a transposed (4, 3) read and a reader iterating a transposed
    (3, 4) one have the same size but not one iteration space: they stay two kernels."""
    a0, c0 = np.arange(12.0).reshape(3, 4), np.arange(12.0).reshape(4, 3) * 10
    with ndl.lazy() as lz:
        a, c = ndl.NDArray(a0), ndl.NDArray(c0)
        t = a.permute((1, 0)) * 2.0                                  # (4, 3), strided read
        u = t.reshape((3, 4)) + c.permute((1, 0))                    # (3, 4), strided read
        del t
    np.testing.assert_array_equal(u.numpy(), (a0.T * 2.0).reshape(3, 4) + c0.T)
    assert "+strided]" not in lz.explain().split("== after fusion")[1]

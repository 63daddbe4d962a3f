"""norm_fast.cu, the backend's default fused softmax, logsumexp and layer-norm forward, against
float64 NumPy: short rows (a warp each), long rows (a block each), lengths that are not a
multiple of a 16-byte pack, rows starting off a 16-byte boundary and out-of-phase pointers.

Expected values are computed here; the course's kernels (softmax.cu, layernorm.cu: graded,
test_cuda_fused.py) are not consulted. The kernel-level cases run under the emulator's full
memory check (uninitialised shared reads, shared-memory races, shuffled block order).
"""
import ml_dtypes  # noqa: F401  (registers the bfloat16 dtype name with NumPy)
import numpy as np
import pytest

import needle as ndl
from needle.backend_cuda import kernel_specs as K
from needle.backend_ndarray import NDArray
from needle.backend_ndarray import fused_ops as F

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not ndl.cuda().enabled(), reason="no CUDA GPU / CuPy (or "
                                 "NEEDLE_CUDA_EMULATOR=1 for the emulator)"),
              pytest.mark.skipif(not all(f in K.KERNEL_FILES for f in K.FAST_FILES),
                                 reason="a student release has no fast kernels")]

# (rows, cols): a warp per row (cols * 4 bytes <= 4096), then a block per row
SHAPES = [(1, 1), (3, 7), (9, 1003), (2, 3, 129), (4, 1024), (3, 1027), (2, 5001)]
TOL = {"float32": 2e-5, "float16": 3e-3, "float64": 1e-12, "bfloat16": 2e-2}


@pytest.fixture
def fast_kernels():
    from needle.backend_cuda import ndarray_backend_cuda as mod
    old = mod.get_reduce_kernel()
    mod.set_reduce_kernel("fast")
    yield
    mod.set_reduce_kernel(old)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    return (x - mu) * rstd * w + b, mu[..., 0], rstd[..., 0]


def test_launch_shapes_take_a_warp_for_short_rows_and_a_block_for_long():
    assert K.norm_launch(100, 1024, 4) == (13, 256, 32)
    assert K.norm_launch(100, 1025, 4) == (100, 128, 128)
    assert K.norm_launch(8192, 4096, 4) == (8192, 256, 256)
    assert K.norm_launch(2, 10 ** 6, 4)[1:] == (512, 512)
    with pytest.raises(ValueError, match="rows > 0 and cols > 0"):
        K.norm_launch(0, 5, 4)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fast_softmax_and_logsumexp_match_numpy(fast_kernels, dtype, shape):
    x = (np.random.default_rng(1).standard_normal(shape) * 4).astype(dtype)
    a = NDArray(x, device=ndl.cuda())
    x64, tol = x.astype(np.float64), TOL[dtype]
    np.testing.assert_allclose(F.softmax(a).numpy().astype(np.float64), _softmax(x64),
                               rtol=tol, atol=tol)
    want = np.log(np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1)) + x64.max(-1)
    np.testing.assert_allclose(F.logsumexp(a).numpy().astype(np.float64), want,
                               rtol=tol * 10, atol=tol * 10)


def test_fast_softmax_handles_infinities(fast_kernels):
    x = np.array([[-np.inf, 0.0, 1.0], [-np.inf, -np.inf, 2.0], [-np.inf] * 3], np.float32)
    a = NDArray(x, device=ndl.cuda())
    got = F.softmax(a).numpy()
    np.testing.assert_allclose(got[:2], _softmax(x[:2]), rtol=1e-6)
    assert np.isnan(got[2]).all()  # like numpy/torch: 0/0
    assert F.logsumexp(a).numpy()[2] == -np.inf


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("shape", SHAPES[1:], ids=str)
def test_fast_layer_norm_matches_numpy_forward_and_backward(fast_kernels, dtype, shape):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    w, b = (rng.standard_normal(shape[-1]).astype(dtype) for _ in range(2))
    g = [NDArray(v, device=ndl.cuda()) for v in (x, w, b)]
    tol = TOL[dtype] * 5
    y, mu, rstd = F.layer_norm(*g)
    for got, want in zip((y, mu, rstd), _layer_norm(*(v.astype(np.float64) for v in (x, w, b)))):
        np.testing.assert_allclose(got.numpy().astype(np.float64), want, rtol=tol, atol=tol)
    # the backward (layernorm.cu's kernels either way) from the fast forward's statistics
    dy = rng.standard_normal(shape).astype(dtype)
    dx, dw, db = F.layer_norm_backward(NDArray(dy, device=ndl.cuda()), g[0], g[1], mu, rstd)
    lead = tuple(range(x.ndim - 1))
    np.testing.assert_allclose(db.numpy().astype(np.float64), dy.astype(np.float64).sum(lead),
                               rtol=tol * 10, atol=tol * 10 * np.sqrt(x.size))


# ---------------------------------------------------------------------- kernels, full check
def _kernel(name: str, dtype: str = "float32"):
    from needle.backend_cuda.emulator.module import load_module
    mod = load_module(K.named_source("norm_fast.cu"), K.name_expressions("norm_fast.cu", dtype),
                      K.NVRTC_OPTIONS + K.include_options())
    assert mod.check == "full"
    return mod.get_function(K.typed_name(name, dtype))


emulated_only = pytest.mark.skipif(not getattr(ndl.cuda().mod, "EMULATED", False),
                                   reason="the emulator's full memory check")


@emulated_only
@pytest.mark.parametrize("shape", [(5, 301), (3, 1500)], ids=str)  # a warp / a block per row
@pytest.mark.parametrize("x_at,y_at", [(0, 0), (1, 1), (1, 0), (3, 2)])
def test_softmax_kernel_off_a_16_byte_boundary_under_full_check(monkeypatch, shape, x_at,
                                                                y_at):
    """Rows starting 4, 8 or 12 bytes past a boundary (a head done one by one), and x and y
    out of phase (each row element by element)."""
    from needle.backend_cuda.emulator import fake_cupy as cp
    monkeypatch.setenv("NEEDLE_CUDA_EMULATOR_CHECK", "full")
    rows, cols = shape
    x = np.random.default_rng(3).uniform(-3, 3, rows * cols + x_at).astype(np.float32)
    xd, yd = cp.asarray(x), cp.asarray(np.full(rows * cols + y_at, 7, np.float32))
    grid, block, group = K.norm_launch(rows, cols, 4)
    _kernel("softmax_rows_fast")((grid,), (block,), (xd[x_at:], yd[y_at:], np.int64(rows),
                                                     np.int64(cols), np.int32(group)))
    want = _softmax(x[x_at:].astype(np.float64).reshape(rows, cols))
    np.testing.assert_allclose(yd.get()[y_at:].reshape(rows, cols), want, rtol=2e-5, atol=1e-7)
    assert (yd.get()[:y_at] == 7).all()


@emulated_only
@pytest.mark.parametrize("shape", [(5, 301), (3, 1500)], ids=str)
@pytest.mark.parametrize("w_at", [0, 1])
def test_layer_norm_kernel_off_a_16_byte_boundary_under_full_check(monkeypatch, shape, w_at):
    from needle.backend_cuda.emulator import fake_cupy as cp
    monkeypatch.setenv("NEEDLE_CUDA_EMULATOR_CHECK", "full")
    rows, cols = shape
    rng = np.random.default_rng(4)
    x = rng.uniform(-3, 3, (rows, cols)).astype(np.float32)
    wb = rng.standard_normal((2, cols + w_at)).astype(np.float32)
    w, b = wb[0, w_at:], wb[1, w_at:]
    y, mean, rstd = (cp.asarray(np.zeros(n, np.float32)) for n in (rows * cols, rows, rows))
    grid, block, group = K.norm_launch(rows, cols, 4)
    _kernel("layernorm_fwd_fast")((grid,), (block,), (
        cp.asarray(x), cp.asarray(wb[0])[w_at:], cp.asarray(wb[1])[w_at:], y, mean, rstd,
        np.int64(rows), np.int64(cols), np.float32(1e-5), np.int32(group)))
    want = _layer_norm(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64))
    for got, ref in zip((y.get().reshape(rows, cols), mean.get(), rstd.get()), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode,files", [("fast", {"norm_fast.cu"}),
                                        ("course", {"softmax.cu", "layernorm.cu"})])
def test_the_switch_picks_the_kernel_file(monkeypatch, mode, files):
    from needle.backend_cuda import _runtime as rt
    from needle.backend_cuda import ndarray_backend_cuda as mod
    seen = set()
    real = rt.kernel

    def spy(filename, *args):
        seen.add(filename)
        return real(filename, *args)

    monkeypatch.setattr(rt, "kernel", spy)
    old = mod.get_reduce_kernel()
    mod.set_reduce_kernel(mode)
    try:
        x = NDArray(np.ones((2, 5), np.float32), device=ndl.cuda())
        F.softmax(x)
        F.layer_norm(x, NDArray(np.ones(5, np.float32), device=ndl.cuda()),
                     NDArray(np.zeros(5, np.float32), device=ndl.cuda()))
    finally:
        mod.set_reduce_kernel(old)
    assert seen & {"norm_fast.cu", "softmax.cu", "layernorm.cu"} == files

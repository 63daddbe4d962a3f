"""Fused kernels against NumPy and against needle's own unfused (naive) versions.

The naive versions are plain NDArray compositions and are checked on the CPU here; the fused
kernels (the CUDA device's optional primitives, reached through
``needle.backend_ndarray.fused_ops``) are checked on a GPU when one is present.
"""
import numpy as np
import pytest
from helpers import adam_reference, dropout_uniform_reference

import needle as ndl
from needle.backend_ndarray import NDArray
from needle.backend_ndarray import fused_ops as F

_NO_CUDA = pytest.mark.skipif(not ndl.cuda().enabled(), reason="no CUDA GPU / CuPy (or "
                              "NEEDLE_CUDA_EMULATOR=1 for the emulator)")
DEVICES = [ndl.cpu(), pytest.param(ndl.cuda(), marks=[pytest.mark.cuda, _NO_CUDA])]


def cuda_only(test):
    """Mark ``test`` as a CUDA test, skipped where ndl.cuda() is not enabled."""
    return pytest.mark.cuda(_NO_CUDA(test))

SHAPES = [(1, 1), (3, 7), (5, 1000), (2, 3, 129), (64, 4097)]


@pytest.fixture
def course_kernels():
    """The course's softmax.cu and layernorm.cu (graded: hw3.cuda.backend), not the backend's
    default norm_fast.cu (tests/backend_cuda/test_cuda_norm_fast.py)."""
    from needle.backend_cuda import ndarray_backend_cuda as mod
    old = mod.get_reduce_kernel()
    mod.set_reduce_kernel("course")
    yield
    mod.set_reduce_kernel(old)


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True, initial=-np.inf))  # initial: empty axes
    return e / e.sum(axis=axis, keepdims=True)


def _layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    return (x - mu) * rstd * w + b, mu[..., 0], rstd[..., 0]


def _layer_norm_grads(dy, x, w, eps=1e-5):
    """Analytic layer-norm gradients in float64 (Ba et al. 2016)."""
    mu = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    xhat = (x - mu) * rstd
    g = dy * w
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    lead = tuple(range(x.ndim - 1))
    return dx, (dy * xhat).sum(lead), dy.sum(lead)


@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "cuda"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_softmax_and_logsumexp_naive(device, shape):
    x = np.random.randn(*shape).astype(np.float32) * 5
    a = NDArray(x, device=device)
    np.testing.assert_allclose(F.softmax_naive(a).numpy(), _softmax(x, -1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(F.softmax_naive(a, 0).numpy(), _softmax(x, 0), rtol=1e-5,
                               atol=1e-6)
    want = np.log(np.exp(x.astype(np.float64)).sum(-1))
    np.testing.assert_allclose(F.logsumexp_naive(a).numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "cuda"])
@pytest.mark.parametrize("shape,axis", [((3, 0), -1), ((3, 0), 0), ((0, 4), 0)], ids=str)
def test_softmax_of_an_empty_array_is_empty(device, shape, axis):
    """Like NumPy and torch (the naive version raised: max over an empty axis)."""
    a = NDArray(np.zeros(shape, np.float32), device=device)
    for f in (F.softmax, F.softmax_naive):
        out = f(a, axis)
        assert out.shape == shape and out.dtype == "float32" and out.device == device


@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "cuda"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_layer_norm_naive_forward_and_backward(device, shape):
    x = np.random.randn(*shape)
    w, b, dy = np.random.randn(shape[-1]), np.random.randn(shape[-1]), np.random.randn(*shape)
    arr = [NDArray(v, device=device, dtype="float64") for v in (x, w, b, dy)]
    y, mu, rstd = F.layer_norm_naive(arr[0], arr[1], arr[2])
    for got, want in zip((y, mu, rstd), _layer_norm(x, w, b)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10)
    grads = F.layer_norm_backward_naive(arr[3], arr[0], arr[1], mu, rstd)
    for got, want in zip(grads, _layer_norm_grads(dy, x, w)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-9)


def test_layer_norm_grads_match_finite_differences():
    """The analytic reference itself, checked by central differences (float64)."""
    x, dy = np.random.randn(2, 5), np.random.randn(2, 5)
    w, b = np.random.randn(5), np.random.randn(5)
    dx, dw, _ = _layer_norm_grads(dy, x, w)
    h = 1e-6
    for idx in [(0, 0), (1, 3)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        num = ((_layer_norm(xp, w, b)[0] - _layer_norm(xm, w, b)[0]) * dy).sum() / (2 * h)
        assert abs(num - dx[idx]) < 1e-6
    wp, wm = w.copy(), w.copy()
    wp[2] += h
    wm[2] -= h
    num = ((_layer_norm(x, wp, b)[0] - _layer_norm(x, wm, b)[0]) * dy).sum() / (2 * h)
    assert abs(num - dw[2]) < 1e-6


def test_dropout_naive_keeps_expected_fraction_and_scales():
    np.random.seed(3)
    x = NDArray(np.ones((200, 50), np.float32))
    y, keep = F.dropout_naive(x, 0.3)
    y, keep = y.numpy(), keep.numpy()
    assert abs(keep.mean() - 0.7) < 0.02
    np.testing.assert_allclose(y[keep], 1 / 0.7, rtol=1e-6)
    assert (y[~keep] == 0).all()


def test_dropout_uniform_reference_is_uniform_and_replayable():
    u = dropout_uniform_reference(seed=7, offset=0, n=200000)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.005
    np.testing.assert_array_equal(dropout_uniform_reference(7, 100, 10), u[100:110])
    assert not np.array_equal(dropout_uniform_reference(8, 0, 10), u[:10])


def test_cpu_arrays_take_the_composed_path():
    """The CPU backend offers no fused primitive, so each fused op is its naive version
    there."""
    for name in F.FUSED_PRIMITIVES:
        assert not F.has_primitive(ndl.cpu(), name)
    a = NDArray(np.random.randn(2, 3).astype(np.float32))
    np.testing.assert_array_equal(F.softmax(a).numpy(), F.softmax_naive(a).numpy())


# ---------------------------------------------------------------------- GPU: fused vs naive
@cuda_only
def test_cuda_device_offers_every_fused_primitive():
    for name in F.FUSED_PRIMITIVES:
        assert F.has_primitive(ndl.cuda(), name), name


@cuda_only
@pytest.mark.usefixtures("course_kernels")
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 3e-3), ("float64", 1e-12)])
@pytest.mark.parametrize("shape", SHAPES + [(3, 0), (2, 3, 1)], ids=str)
def test_fused_softmax_logsumexp(dtype, tol, shape):
    x = (np.random.randn(*shape) * 4).astype(dtype)
    a = NDArray(x, device=ndl.cuda())
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(F.softmax(a).numpy().astype(np.float64), _softmax(x64, -1),
                               rtol=tol, atol=tol)
    np.testing.assert_allclose(F.softmax(a, 0).numpy().astype(np.float64), _softmax(x64, 0),
                               rtol=tol, atol=tol)
    np.testing.assert_allclose(F.softmax(a).numpy(), F.softmax_naive(a).numpy(), rtol=tol,
                               atol=tol)
    if shape[-1]:
        want = np.log(np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1)) + x64.max(-1)
        np.testing.assert_allclose(F.logsumexp(a).numpy().astype(np.float64), want,
                                   rtol=tol * 10, atol=tol * 10)


@cuda_only
@pytest.mark.usefixtures("course_kernels")
def test_fused_softmax_handles_infinities():
    x = np.array([[-np.inf, 0.0, 1.0], [-np.inf, -np.inf, 2.0], [-np.inf] * 3], np.float32)
    got = F.softmax(NDArray(x, device=ndl.cuda())).numpy()
    np.testing.assert_allclose(got[:2], _softmax(x[:2], -1), rtol=1e-6)
    assert np.isnan(got[2]).all()  # like numpy/torch: 0/0
    np.testing.assert_array_equal(F.logsumexp(NDArray(x, device=ndl.cuda())).numpy()[2], -np.inf)


@cuda_only
@pytest.mark.usefixtures("course_kernels")
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("float16", 2e-2), ("float64", 1e-10)])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 1000), (2, 3, 129), (300, 1024)], ids=str)
def test_fused_layer_norm(dtype, tol, shape):
    x = np.random.randn(*shape).astype(dtype)
    w, b = np.random.randn(shape[-1]).astype(dtype), np.random.randn(shape[-1]).astype(dtype)
    dy = np.random.randn(*shape).astype(dtype)
    g = [NDArray(a, device=ndl.cuda()) for a in (x, w, b, dy)]
    x64, w64, b64, dy64 = (a.astype(np.float64) for a in (x, w, b, dy))
    y, mu, rstd = F.layer_norm(g[0], g[1], g[2])
    for got, want in zip((y, mu, rstd), _layer_norm(x64, w64, b64)):
        np.testing.assert_allclose(got.numpy().astype(np.float64), want, rtol=tol, atol=tol)
    grads = F.layer_norm_backward(g[3], g[0], g[1], mu, rstd)
    for got, want in zip(grads, _layer_norm_grads(dy64, x64, w64)):
        scale = max(1.0, np.abs(want).max())
        np.testing.assert_allclose(got.numpy().astype(np.float64) / scale, want / scale,
                                   rtol=tol * 10, atol=tol * 10)


@cuda_only
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("decoupled", [False, True])
def test_multi_tensor_adam_matches_reference(dtype, decoupled):
    n = 1000003
    p, g = np.random.randn(n).astype(dtype), np.random.randn(n).astype(dtype)
    m, v = np.random.randn(n).astype(np.float32) * 0.1, np.random.rand(n).astype(np.float32)
    dev = ndl.cuda()
    P, G, M, V = (NDArray(a, device=dev) for a in (p, g, m, v))
    state = F.MultiTensorState(dev, 3)  # the tensor at slot 2, its second step
    F.multi_tensor_adam([P], [G], [M], [V], [2], [2], state, lr=1e-3, weight_decay=0.01,
                        decoupled=decoupled)
    want = adam_reference(*(a.astype(np.float64) for a in (p, g, m, v)), 2, 1e-3, 0.9, 0.999,
                           1e-8, 0.01, decoupled)
    tol = 1e-5 if dtype == "float32" else 2e-3
    for got, w in zip((P, M, V), want):
        np.testing.assert_allclose(got.numpy().astype(np.float64), w, rtol=tol, atol=tol)


@cuda_only
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fused_dropout_matches_its_rng_and_backward(dtype):
    x = np.random.randn(3, 1001).astype(dtype)
    dev = ndl.cuda()
    y, mask = F.dropout(NDArray(x, device=dev), 0.25, seed=11, offset=5)
    keep = dropout_uniform_reference(11, 5, x.size).reshape(x.shape) >= 0.25
    np.testing.assert_array_equal(mask.numpy(), keep)
    np.testing.assert_allclose(y.numpy(), np.where(keep, x / np.float32(0.75), 0).astype(dtype),
                               rtol=1e-3)
    dx = F.dropout_backward(NDArray(np.ones_like(x), device=dev), mask, 0.25)
    np.testing.assert_allclose(dx.numpy(), keep / 0.75, rtol=1e-3)

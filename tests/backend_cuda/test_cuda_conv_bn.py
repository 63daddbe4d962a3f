"""Convolution and batch norm on the CUDA device's kernels (``conv_im2col``/``conv_col2im``
with GEMMs, ``batch_norm_fwd``/``batch_norm_bwd``) against the course's composed path (the
same ops and layers with ``use_kernel`` off) and against central differences in float64."""
import numpy as np
import pytest

import needle as ndl
from needle import nn, ops
from needle.backend_ndarray import fused_ops as F

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    not ndl.cuda().enabled(), reason="no CUDA GPU / CuPy (or NEEDLE_CUDA_EMULATOR=1)")]

# (N, H, W, C_in, K, C_out, stride, padding): odd sizes, batch 1, k = 1, 3, 7, stride 2 and 4,
# no padding, padding wider than K - 1, a non-square image
CONVS = [(2, 7, 7, 3, 3, 4, 1, 1), (1, 9, 8, 2, 3, 5, 2, 1), (2, 11, 11, 3, 7, 4, 4, 3),
         (1, 5, 5, 2, 1, 3, 2, 0), (3, 6, 5, 2, 3, 2, 2, 0), (1, 4, 6, 3, 1, 2, 1, 2),
         (2, 8, 8, 4, 3, 3, 2, 1)]
NORMS = [(2, 3, 4, 5), (1, 40, 3, 3), (5, 2, 1, 1), (3, 7, 9, 11), (1, 33, 2, 1)]


@pytest.fixture
def composed(monkeypatch):
    """Run ``fn`` with the device kernels switched off (the course's composed path)."""
    def run(fn, *args):
        with monkeypatch.context() as m:
            for cls in (ops.Conv, nn.Conv, nn.BatchNorm1d):
                m.setattr(cls, "use_kernel", False)
            return fn(*args)
    return run


def _conv_run(xs, ws, stride, padding, dtype="float64", layout="nhwc"):
    dev = ndl.cuda()
    x = ndl.Tensor(xs, device=dev, dtype=dtype, requires_grad=True)
    w = ndl.Tensor(ws, device=dev, dtype=dtype, requires_grad=True)
    inp = x.transpose((1, 2)).transpose((2, 3)) if layout == "nchw" else x  # a strided view
    y = ops.conv(inp, w, stride=stride, padding=padding)
    (y * y).sum().backward()
    return y.numpy(), x.grad.numpy(), w.grad.numpy()


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("case", CONVS, ids=str)
def test_conv_kernels_match_the_course_conv(case, layout, composed):
    n, h, w, c, k, co, s, p = case
    rng = np.random.default_rng(sum(case))
    xs = rng.standard_normal((n, c, h, w) if layout == "nchw" else (n, h, w, c))
    ws = rng.standard_normal((k, k, c, co))
    got = _conv_run(xs, ws, s, p, layout=layout)
    want = composed(_conv_run, xs, ws, s, p, "float64", layout)
    for g, r in zip(got, want):
        assert g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-10)


def _central_diff(f, a, eps=1e-6):
    grad = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        old = a[i]
        a[i] = old + eps
        hi = f()
        a[i] = old - eps
        lo = f()
        a[i] = old
        grad[i] = (hi - lo) / (2 * eps)
    return grad


@pytest.mark.parametrize("case", [(1, 5, 4, 2, 3, 2, 2, 1), (2, 4, 4, 1, 1, 2, 1, 1),
                                  (1, 7, 7, 1, 7, 1, 4, 3)], ids=str)
def test_conv_kernel_gradients_match_central_differences(case):
    n, h, w, c, k, co, s, p = case
    rng = np.random.default_rng(7)
    xs, ws = rng.standard_normal((n, h, w, c)), rng.standard_normal((k, k, c, co))
    gs = None

    def loss():
        y = ops.conv(ndl.Tensor(xs, device=ndl.cuda(), dtype="float64"),
                     ndl.Tensor(ws, device=ndl.cuda(), dtype="float64"), stride=s, padding=p)
        return float((y.numpy() * gs).sum())
    y, dx, dw = _conv_run(xs, ws, s, p)
    gs = 2 * y  # _conv_run's loss is sum(y^2): the same gradients as <y, 2 y_fixed>
    np.testing.assert_allclose(dx, _central_diff(loss, xs), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dw, _central_diff(loss, ws), rtol=1e-6, atol=1e-7)


def _layer_run(xs, k, co, stride, bias, dtype="float64"):
    np.random.seed(3)
    layer = nn.Conv(xs.shape[1], co, k, stride=stride, bias=bias, device=ndl.cuda(),
                    dtype=dtype)
    x = ndl.Tensor(xs, device=ndl.cuda(), dtype=dtype, requires_grad=True)
    y = layer(x)
    (y * y).sum().backward()
    grads = [x.grad.numpy(), layer.weight.grad.numpy()]
    return [y.numpy()] + grads + ([layer.bias.grad.numpy()] if bias else [])


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("k,stride", [(3, 1), (3, 2), (7, 4), (1, 1)])
def test_conv_layer_with_bias_matches_the_course_layer(k, stride, bias, composed):
    xs = np.random.default_rng(k * stride).standard_normal((2, 3, 9, 9))
    got = _layer_run(xs, k, 4, stride, bias)
    want = composed(_layer_run, xs, k, 4, stride, bias)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-10)


def test_conv_kernels_in_float32_and_input_without_gradient(composed):
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal((2, 9, 9, 3)), rng.standard_normal((3, 3, 3, 5))

    def run():
        x = ndl.Tensor(xs, device=ndl.cuda(), dtype="float32", requires_grad=False)
        w = ndl.Tensor(ws, device=ndl.cuda(), dtype="float32", requires_grad=True)
        y = ops.conv(x, w, stride=2, padding=1)
        (y * y).sum().backward()
        return y.numpy(), w.grad.numpy(), x.grad
    y, dw, dx = run()
    y0, dw0, _ = composed(run)
    assert dx is None and y.dtype == np.float32
    np.testing.assert_allclose(y, y0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, dw0, rtol=1e-5, atol=1e-4)


def _bn_run(xs, gs, ws, dtype="float64", layout="nchw", steps=1):
    dev = ndl.cuda()
    bn = nn.BatchNorm2d(xs.shape[1], momentum=0.2, device=dev, dtype=dtype)
    bn.weight.data = ndl.Tensor(ws, device=dev, dtype=dtype)
    x = ndl.Tensor(xs.transpose(0, 2, 3, 1).copy() if layout == "nhwc" else xs, device=dev,
                   dtype=dtype, requires_grad=True)
    for _ in range(steps):  # the running statistics move each step
        inp = x.transpose((2, 3)).transpose((1, 2)) if layout == "nhwc" else x
        y = bn(inp)
    (y * ndl.Tensor(gs, device=dev, dtype=dtype)).sum().backward()
    return (y.numpy(), x.grad.numpy(), bn.weight.grad.numpy(), bn.bias.grad.numpy(),
            bn.running_mean.numpy(), bn.running_var.numpy())


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("shape", NORMS, ids=str)
def test_batch_norm_kernels_match_the_course_layer(shape, layout, composed):
    rng = np.random.default_rng(shape[1])
    xs, gs = rng.standard_normal(shape) * 3 + 1, rng.standard_normal(shape)
    ws = rng.standard_normal(shape[1])
    got = _bn_run(xs, gs, ws, layout=layout, steps=2)
    want = composed(_bn_run, xs, gs, ws, "float64", layout, 2)
    for g, r in zip(got, want):
        assert g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=1e-9, atol=1e-10)


def test_batch_norm_kernel_gradients_match_central_differences():
    rng = np.random.default_rng(1)
    shape = (2, 3, 3, 2)
    xs, gs, ws = rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(3)

    def loss():
        bn = nn.BatchNorm2d(3, device=ndl.cuda(), dtype="float64")
        bn.weight.data = ndl.Tensor(ws, device=ndl.cuda(), dtype="float64")
        return float((bn(ndl.Tensor(xs, device=ndl.cuda(), dtype="float64")).numpy()
                      * gs).sum())
    _, dx, dw, db, _, _ = _bn_run(xs, gs, ws)
    np.testing.assert_allclose(dx, _central_diff(loss, xs), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dw, _central_diff(loss, ws), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(db, gs.sum((0, 2, 3)), rtol=1e-10)


def test_batch_norm_kernels_in_float32_and_eval_mode(composed):
    rng = np.random.default_rng(2)
    shape = (4, 16, 5, 5)
    xs, gs, ws = rng.standard_normal(shape) * 2, rng.standard_normal(shape), np.ones(16)
    got = _bn_run(xs, gs, ws, "float32")
    want = composed(_bn_run, xs, gs, ws, "float32")
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    bn = nn.BatchNorm2d(16, device=ndl.cuda())
    bn(ndl.Tensor(xs, device=ndl.cuda()))
    bn.eval()  # eval: the running statistics, the composed path
    y = bn(ndl.Tensor(xs, device=ndl.cuda())).numpy()
    rm, rv = bn.running_mean.numpy(), bn.running_var.numpy()
    want_y = (xs - rm[:, None, None]) / np.sqrt(rv[:, None, None] + 1e-5)
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-5)


def test_fused_conv_and_batch_norm_need_the_primitives():
    x = ndl.NDArray(np.zeros((1, 3, 3, 1)), device=ndl.cpu())
    with pytest.raises(ValueError, match="conv_im2col"):
        F.conv2d(x, ndl.NDArray(np.zeros((1, 1, 1, 1)), device=ndl.cpu()), None, 1, 0)
    with pytest.raises(ValueError, match="batch_norm_fwd"):
        F.batch_norm(x, x, x, x, x, 0.1, 1e-5)
    assert F.has_primitive(ndl.cuda(), "conv_im2col")
    assert F.has_primitive(ndl.cuda(), "batch_norm_fwd")


def test_conv_bias_gradient_over_many_rows_takes_two_passes(composed):
    xs = np.random.default_rng(5).standard_normal((1, 2, 70, 70))  # 4900 output rows
    got = _layer_run(xs, 3, 3, 1, True)
    want = composed(_layer_run, xs, 3, 3, 1, True)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype,tol", [("float16", 2e-2), ("bfloat16", 1e-1)])
def test_conv_and_batch_norm_kernels_in_half_precision(dtype, tol):
    rng = np.random.default_rng(9)
    xs = rng.standard_normal((2, 3, 9, 9))
    want = _layer_run(xs, 3, 4, 2, True, "float64")
    got = _layer_run(xs, 3, 4, 2, True, dtype)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g.astype(np.float64), r, rtol=tol, atol=tol * np.abs(r).max())
    gs, ws = rng.standard_normal((2, 3, 9, 9)), rng.standard_normal(3)
    want = _bn_run(xs, gs, ws, "float64")
    got = _bn_run(xs, gs, ws, dtype)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g.astype(np.float64), r, rtol=tol, atol=tol * np.abs(r).max())

"""Drop-in compatibility with the course's needle: what its homework tests and notebooks do.

Each test does what the course's material does (its code inlined where short) against this
package: apps imported top-level, ``NDArray.flat`` in the gradient checker, NumPy reading
``cached_data``, the tiled-layout matmul, a disabled CUDA device in parametrize lists, and
float32 matmul equal to NumPy's bit for bit.
"""
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import needle as ndl
from needle.backend_ndarray import ndarray_backend_numpy as numpy_backend
from needle.backend_ndarray.device import BackendDevice
from tests.course_public.course_data import gradient_check

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------ apps on sys.path
def test_apps_import_top_level_as_the_course_tests_do():
    res = _run("""
        import sys
        sys.path.append("./apps")
        from simple_ml import *
        import mlp_resnet, models, demo
        assert callable(softmax_loss) and callable(nn_epoch) and callable(parse_mnist)
        assert callable(mlp_resnet.MLPResNet) and callable(demo.digits_demo)
        import apps.simple_ml
        assert callable(apps.simple_ml.softmax_loss)
        print("ok")
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


# ------------------------------------------------------------------ NDArray.flat
def test_flat_is_a_view_that_writes_through():
    x = ndl.NDArray(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert x.flat.shape == (12,)
    x.flat[5] += 0.5
    x.flat[0] = 7.0
    expected = np.arange(12, dtype=np.float32)
    expected[5] += 0.5
    expected[0] = 7.0
    np.testing.assert_array_equal(x.numpy().ravel(), expected)


def test_flat_of_a_view_reads_its_own_elements():
    base = ndl.NDArray(np.arange(12, dtype=np.float32).reshape(3, 4))
    np.testing.assert_array_equal(base.permute((1, 0)).flat.numpy(),
                                  np.arange(12).reshape(3, 4).T.ravel())


def test_course_gradient_checker_runs_through_flat():
    a = ndl.Tensor(np.random.randn(3, 4), dtype="float64")
    b = ndl.Tensor(np.random.randn(4, 2), dtype="float64")
    before = a.numpy().copy()
    grads = gradient_check(ndl.matmul, a, b, tol=1e-5)
    np.testing.assert_allclose(grads[0], np.ones((3, 2)) @ b.numpy().T, rtol=1e-6)
    np.testing.assert_allclose(a.numpy(), before, rtol=0, atol=1e-12)  # +eps -2eps +eps
    gradient_check(lambda x: ndl.exp(x).sum(axes=(1,)), a, tol=1e-4, backward=True)


def test_flat_plus_eps_changes_the_tensor_in_place():
    t = ndl.Tensor(np.zeros((2, 3)), dtype="float64")
    t.realize_cached_data().flat[4] += 1e-4
    expected = np.zeros(6)
    expected[4] = 1e-4
    np.testing.assert_array_equal(t.numpy().ravel(), expected)


# ------------------------------------------------------------------ NumPy's array protocol
def test_cached_data_reads_as_a_numpy_array():
    x = np.random.randn(4, 5).astype(np.float32)
    b = np.random.randn(4, 5).astype(np.float32)
    t = ndl.Tensor(x)
    cd = t.cached_data
    np.testing.assert_array_equal(np.array(cd), x)
    assert np.array(cd).dtype == np.float32
    assert np.array(cd, dtype=np.float64).dtype == np.float64
    assert np.linalg.norm(cd) == pytest.approx(np.linalg.norm(x), rel=1e-6)
    diff = abs(cd - b)                                  # NDArray - numpy, then __abs__
    np.testing.assert_array_equal(np.asarray(diff), np.abs(x - b))
    assert np.linalg.norm(cd - b) == pytest.approx(np.linalg.norm(x - b), rel=1e-6)
    np.testing.assert_allclose(cd, x)
    np.testing.assert_array_equal(np.abs(ndl.NDArray(-x)), np.abs(x))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "truediv", "eq", "ne", "lt", "le", "gt",
                                "ge"])
def test_numpy_on_the_left_gives_the_same_ndarray_as_on_the_right(op):
    import operator
    fn = getattr(operator, op)
    x = np.random.randn(3, 4).astype(np.float32)
    y = np.random.randn(3, 4).astype(np.float32)
    y[0, 0] = x[0, 0]  # an equal pair for the comparisons
    nd = ndl.NDArray(x)
    left = fn(y, nd)     # NumPy defers to NDArray's reflected operator
    right = fn(ndl.NDArray(y), nd)
    assert isinstance(left, ndl.NDArray)
    assert left.dtype == right.dtype
    np.testing.assert_array_equal(left.numpy(), fn(y, x))
    np.testing.assert_array_equal(left.numpy(), right.numpy())


def test_numpy_scalar_on_the_left_stays_ndarray():
    nd = ndl.NDArray(np.ones((2, 2), dtype=np.float32))
    out = np.float32(3) * nd
    assert isinstance(out, ndl.NDArray) and out.dtype == "float32"
    np.testing.assert_array_equal(out.numpy(), np.full((2, 2), 3, np.float32))


def test_array_protocol_refuses_a_no_copy_request():
    nd = ndl.NDArray(np.ones(3, dtype=np.float32))
    with pytest.raises(ValueError):
        np.asarray(nd, copy=False)


# ------------------------------------------------------------------ tiled matmul
def _to_tiles(x: np.ndarray, t: int) -> np.ndarray:
    r, c = x.shape
    return np.ascontiguousarray(x.reshape(r // t, t, c // t, t).swapaxes(1, 2))


@pytest.mark.parametrize("m,n,p", [(8, 8, 8), (16, 8, 24), (32, 64, 16)])
def test_matmul_tiled_primitive_on_the_tiled_layout(m, n, p):
    dev = ndl.cpu()
    t = dev.__tile_size__
    assert t == 8
    x = np.random.randn(m, n).astype(np.float32)
    y = np.random.randn(n, p).astype(np.float32)
    a, b, out = (numpy_backend.Array(s) for s in (m * n, n * p, m * p))
    a.array[:] = _to_tiles(x, t).ravel()
    b.array[:] = _to_tiles(y, t).ravel()
    dev.matmul_tiled(a, b, out, m, n, p)
    np.testing.assert_allclose(out.array.reshape(m // t, p // t, t, t), _to_tiles(x @ y, t),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,n,p", [(8, 8, 8), (16, 32, 8), (64, 64, 64), (8, 9, 8)])
def test_ndarray_matmul_routes_aligned_shapes_through_matmul_tiled(m, n, p, monkeypatch):
    dev = ndl.cpu()
    calls = []
    real = dev.matmul_tiled
    monkeypatch.setattr(dev, "TILED_MATMUL", True)
    monkeypatch.setattr(dev, "matmul_tiled", lambda *a: calls.append(a[3:]) or real(*a))
    x = np.random.randn(m, n).astype(np.float32)
    y = np.random.randn(n, p).astype(np.float32)
    got = (ndl.NDArray(x) @ ndl.NDArray(y)).numpy()
    aligned = all(d % dev.__tile_size__ == 0 for d in (m, n, p))
    assert calls == ([(m, n, p)] if aligned else [])
    np.testing.assert_array_equal(got, x @ y)
    # a transposed (non-compact) operand is tiled from its strides
    got_t = (ndl.NDArray(np.ascontiguousarray(x.T)).permute((1, 0)) @ ndl.NDArray(y)).numpy()
    np.testing.assert_array_equal(got_t, x @ y)


# ------------------------------------------------------------------ disabled devices
def test_disabled_device_raises_attribute_error():
    dev = BackendDevice("cuda", None, 3)
    assert not dev.enabled()
    assert not hasattr(dev, "matmul")
    assert getattr(dev, "__tile_size__", None) is None
    assert getattr(dev, "__name__", "default") == "default"
    with pytest.raises(AttributeError, match="not enabled"):
        dev.ewise_add  # noqa: B018
    assert repr(dev) == "cuda(3)"


def test_pytest_collects_parametrize_over_cpu_and_cuda(tmp_path):
    test_file = tmp_path / "test_devices.py"
    test_file.write_text(textwrap.dedent("""
        import pytest
        import needle as ndl
        from needle.backend_ndarray.device import BackendDevice

        DEVICES = [ndl.cpu(), ndl.cuda(), BackendDevice("cuda", None, 7)]

        @pytest.mark.parametrize("device", DEVICES)
        def test_device(device):
            assert device.name in ("cpu", "cuda")
    """))
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--collect-only", str(test_file)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 tests collected" in res.stdout, res.stdout


# ------------------------------------------------------------------ matmul bits
@pytest.mark.parametrize("m,n,p", [(1, 9, 4), (1, 30, 24), (23, 38, 1), (1, 5, 1), (7, 6, 5),
                                   (5, 4, 3), (16, 16, 16), (1, 64, 64), (64, 64, 1)])
@pytest.mark.parametrize("trans", ["none", "a", "b", "both"])
def test_float32_matmul_equals_numpy_bit_for_bit(m, n, p, trans):
    """Gradients pass transposed views; the result must not depend on that (rtol 1e-7)."""
    x = np.random.randn(m, n).astype(np.float32)
    y = np.random.randn(n, p).astype(np.float32)
    a = ndl.NDArray(np.ascontiguousarray(x.T)).permute((1, 0)) if trans in ("a", "both") \
        else ndl.NDArray(x)
    b = ndl.NDArray(np.ascontiguousarray(y.T)).permute((1, 0)) if trans in ("b", "both") \
        else ndl.NDArray(y)
    np.testing.assert_array_equal((a @ b).numpy(), np.matmul(x, y))


@pytest.mark.parametrize("trans", ["a", "b"])
def test_batched_float32_matmul_equals_numpy_bit_for_bit(trans):
    x = np.random.randn(3, 1, 6).astype(np.float32)
    y = np.random.randn(3, 6, 5).astype(np.float32)
    if trans == "a":
        x = np.random.randn(3, 6, 5).astype(np.float32)
        y = np.random.randn(3, 5, 1).astype(np.float32)
    a = ndl.NDArray(np.ascontiguousarray(x.swapaxes(1, 2))).permute((0, 2, 1)) \
        if trans == "a" else ndl.NDArray(x)
    b = ndl.NDArray(np.ascontiguousarray(y.swapaxes(1, 2))).permute((0, 2, 1)) \
        if trans == "b" else ndl.NDArray(y)
    np.testing.assert_array_equal((a @ b).numpy(), np.matmul(x, y))


def test_tensor_matmul_gradient_matches_numpy_bit_for_bit():
    """Gradients (g @ w^T, x^T @ g) equal NumPy on compact operands, as the course's NDArray
    (which compacts transposes) computes them; NumPy's own gemv on a transposed *view* sums
    in another order, so the reference is built from compact copies."""
    x = np.random.randn(1, 7).astype(np.float32)
    w = np.random.randn(7, 5).astype(np.float32)
    g = np.random.randn(1, 5).astype(np.float32)
    a, b = ndl.Tensor(x), ndl.Tensor(w)
    out = a @ b
    ga, gb = out.op.gradient_as_tuple(ndl.Tensor(g), out)
    np.testing.assert_array_equal(ga.numpy(), g @ np.ascontiguousarray(w.T))
    np.testing.assert_array_equal(gb.numpy(), np.ascontiguousarray(x.T) @ g)


# ------------------------------------------------------------------ dtypes
def test_numpy_float64_data_stays_float64_gradients_included():
    """hw1's needle is NumPy-backed: float64 data stays float64 (its 1e-6 checks need it)."""
    a = ndl.Tensor(np.random.randn(4, 3))
    b = ndl.Tensor(np.random.randn(3, 2))
    out = ndl.summation(ndl.exp(a @ b) / 3.0)
    assert a.dtype == b.dtype == out.dtype == "float64"
    out.backward()
    assert a.grad.dtype == "float64" and b.grad.dtype == "float64"
    an, bn = a.numpy(), b.numpy()
    expected = (np.exp(an @ bn) / 3.0) @ bn.T  # d/dA sum(exp(AB)/3), exact in float64
    np.testing.assert_allclose(a.grad.numpy(), expected, rtol=1e-12)


def test_python_data_gives_float32_the_hw3_default():
    assert ndl.Tensor([[1.5, 2.0]]).dtype == "float32"
    assert ndl.Tensor([6]).dtype == "float32" and ndl.Tensor([6]).requires_grad
    assert ndl.Tensor(3).dtype == "float32"
    assert ndl.Tensor(np.random.randn()).dtype == "float64"  # a Python float: NumPy's double
    assert ndl.Tensor(np.float32(1.0)).dtype == "float32"   # NumPy scalars keep theirs
    assert ndl.Tensor(np.array([1, 2], dtype=np.int32)).dtype == "int32"
    assert ndl.Tensor(np.ones(2), dtype="float32").dtype == "float32"
    assert ndl.Tensor(np.array([1, 2], dtype=np.uint16)).numpy().tolist() == [1, 2]
    assert ndl.Tensor(np.array([1, 2], dtype=np.int16)).dtype == "int64"  # widened, not refused
    from needle import backend_ndarray as nd
    assert nd.array([1.0, 2.0]).dtype == "float32"  # hw3's NDArray default


def test_mixed_float_ops_follow_one_rule():
    f32 = ndl.Tensor(np.ones(3, dtype=np.float32))
    f64 = ndl.Tensor(np.ones(3, dtype=np.float64))
    i64 = ndl.Tensor(np.arange(3), requires_grad=False)
    assert (f32 + f64).dtype == "float64" and (f64 * f32).dtype == "float64"  # wider wins
    assert (f32 * i64).dtype == "float32"                   # an int never widens a float
    assert (f32 * 0.1).dtype == "float32" and (0.5 - f32).dtype == "float32"  # nor a scalar
    assert (f32 / np.float64(3.0)).dtype == "float32"
    y = (f32 * f64).sum()
    y.backward()
    assert f32.grad.dtype == "float32" and f64.grad.dtype == "float64"  # grads keep theirs


def test_init_gives_float32_and_optimizers_keep_each_parameters_dtype():
    assert ndl.init.kaiming_uniform(3, 4).dtype == "float32"
    assert ndl.nn.Linear(3, 4).weight.dtype == "float32"
    p32 = ndl.nn.Parameter(np.ones((2, 2), dtype=np.float32))
    p64 = ndl.nn.Parameter(np.ones((2, 2), dtype=np.float64))
    x = ndl.Tensor(np.random.randn(5, 2))  # float64 data through float32 weights
    for opt_cls, kw in ((ndl.optim.SGD, {"momentum": 0.9, "weight_decay": 0.01}),
                        (ndl.optim.Adam, {"weight_decay": 0.01})):
        opt = opt_cls([p32, p64], lr=0.1, **kw)
        for _ in range(2):
            opt.reset_grad()
            ((x @ p32).sum() + (x @ p64).sum()).backward()
            opt.step()
        assert p32.dtype == "float32" and p64.dtype == "float64", opt_cls.__name__


def test_batchnorm_buffers_keep_their_dtype_on_float64_input():
    bn = ndl.nn.BatchNorm1d(3)
    bn(ndl.Tensor(np.random.randn(8, 3)))
    assert bn.running_mean.dtype == "float32" and bn.running_var.dtype == "float32"


# ------------------------------------------------------------------ logsumexp
def test_logsumexp_gradient_splits_tied_maxima_in_float32():
    """exp(x - lse) gives each tied maximum weight 1 when lse rounds to max (near 1e9)."""
    x = ndl.Tensor(np.array([[1e9, 1e9, 0.0], [1e9, 1e9 - 256, 1e9]], dtype=np.float32))
    ndl.logsumexp(x, axes=(1,)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0.5, 0.5, 0.0], [0.5, 0.0, 0.5]], atol=1e-7)
    y = ndl.Tensor(np.array([1e9, 1e9], dtype=np.float32))
    ndl.logsumexp(y).backward()
    np.testing.assert_allclose(y.grad.numpy(), [0.5, 0.5])
    z = ndl.Tensor(np.array([[1e9, 1e9]], dtype=np.float32))
    out = ndl.logsoftmax(z)
    np.testing.assert_allclose(out.numpy(), [[-np.log(2.0)] * 2], rtol=1e-6)
    (out * ndl.Tensor(np.array([[1.0, 0.0]], dtype=np.float32))).sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), [[0.5, -0.5]], atol=1e-7)


def test_logsumexp_gradient_is_still_differentiable():
    x = ndl.Tensor(np.random.randn(3, 4))
    out = ndl.logsumexp(x, axes=(1,)).sum()
    out.backward()
    s = np.exp(x.numpy()) / np.exp(x.numpy()).sum(1, keepdims=True)
    np.testing.assert_allclose(x.grad.numpy(), s, rtol=1e-12)
    w = ndl.Tensor(np.random.randn(3, 4), requires_grad=False)
    (x.grad * w).sum().backward()  # d/dx sum(softmax(x) * w) = s * (w - sum(s * w))
    wn = w.numpy()
    np.testing.assert_allclose(x.grad.numpy(), s * (wn - (s * wn).sum(1, keepdims=True)),
                               rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ modules
def test_sequential_modules_is_the_courses_list():
    inner = ndl.nn.Sequential(ndl.nn.Linear(2, 3), ndl.nn.ReLU())
    model = ndl.nn.Sequential(ndl.nn.Flatten(), inner)
    assert isinstance(model.modules, list) and len(model.modules) == 2
    assert model.modules[1].modules[0] is inner.modules[0]
    assert [type(m).__name__ for _, m in model.named_modules()] == [
        "Sequential", "Flatten", "Sequential", "Linear", "ReLU"]
    assert [type(m).__name__ for m in model.children()] == ["Flatten", "Sequential"]
    assert set(model.state_dict()) == {"modules.1.modules.0.weight", "modules.1.modules.0.bias"}
    model.eval()
    assert not inner.modules[0].training

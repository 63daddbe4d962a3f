"""The CUDA primitives against NumPy on awkward shapes (runs where a GPU is present)."""
import numpy as np
import pytest

import needle as ndl
from needle.backend_cuda import _runtime as rt
from needle.backend_cuda import kernel_specs as K
from needle.backend_ndarray import NDArray

cuda_only = pytest.mark.skipif(not ndl.cuda().enabled(), reason="no CUDA GPU / CuPy (or "
                               "NEEDLE_CUDA_EMULATOR=1 for the emulator)")
pytestmark = [pytest.mark.cuda, cuda_only]

DTYPES = ["float32", "float16", "float64"]
TOL = {"float32": 1e-5, "float16": 2e-3, "float64": 1e-12, "bfloat16": 2e-2}
SHAPES = [(), (0,), (1,), (3, 0, 2), (257,), (33, 65), (2, 3, 1, 5), (2, 1, 3, 1, 2, 3, 2)]


def _rand(shape, dtype="float32", positive=False):
    x = np.asarray(np.random.randn(*shape))  # randn() of no shape is a Python float
    x = np.abs(x) + 0.5 if positive else x
    return x.astype(ndl.backend_ndarray.to_numpy_dtype(dtype))


def _gpu(x, dtype=None):
    return NDArray(x, device=ndl.cuda(), dtype=dtype)


def _close(got, want, dtype):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64),
                               np.asarray(want, dtype=np.float64),
                               rtol=TOL[dtype], atol=TOL[dtype])


def _views(x):
    """Non-contiguous views of a numpy array and the matching needle views."""
    yield "transpose", (lambda a: a.permute(tuple(range(a.ndim))[::-1])), x.T
    if x.ndim >= 1 and x.shape[0] > 1:
        yield "step", (lambda a: a[::2]), x[::2]
        yield "neg-step", (lambda a: a[::-1]), x[::-1]  # flip: negative strides


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_and_compact(shape, dtype):
    x = _rand(shape, dtype)
    a = _gpu(x)
    np.testing.assert_array_equal(a.numpy(), x)
    for name, f, want in _views(x):
        np.testing.assert_array_equal(f(a).compact().numpy(), want, err_msg=name)
        np.testing.assert_array_equal(f(a).numpy(), want, err_msg=name)


def test_compact_7d_permuted_sliced_broadcast():
    x = _rand((3, 1, 4, 2, 5, 1, 3))
    a = _gpu(x)
    v = a.permute((6, 2, 0, 4, 1, 3, 5))[1:, ::3, :, 1::2]
    want = x.transpose(6, 2, 0, 4, 1, 3, 5)[1:, ::3, :, 1::2]
    np.testing.assert_array_equal(v.compact().numpy(), want)
    b = a.broadcast_to((2, 3, 7, 4, 2, 5, 6, 3))
    np.testing.assert_array_equal(b.compact().numpy(), np.broadcast_to(x, b.shape))


@pytest.mark.parametrize("dtype", DTYPES + ["int32", "bool", "uint8"])
def test_setitem_views_and_scalars(dtype):
    x = np.zeros((5, 6, 7), dtype=dtype)
    a = _gpu(x.copy())
    val = np.arange(3 * 3 * 7).reshape(3, 3, 7).astype(dtype)
    a[1:4, ::2, :] = _gpu(val)
    x[1:4, ::2, :] = val
    a[:, 5, ::-3] = 1
    x[:, 5, ::-3] = 1
    a[4] = _gpu(val[0, :1])  # broadcast (1, 7) into (6, 7)
    x[4] = val[0, :1]
    np.testing.assert_array_equal(a.numpy(), x)


@pytest.mark.parametrize("op", ["__add__", "__sub__", "__mul__", "__truediv__", "maximum",
                                "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (1,), (1000,), (7, 129), (2, 1, 3, 1, 2, 3, 2)], ids=str)
def test_binary_ops(op, dtype, shape):
    x, y = _rand(shape, dtype), _rand(shape, dtype)
    y[..., :1] = x[..., :1]  # some ties for the comparisons
    a, b = _gpu(x), _gpu(y)
    ref = {"maximum": np.maximum}.get(op, lambda p, q: getattr(p, op)(q))
    _close(getattr(a, op)(b).numpy(), ref(x, y), dtype)
    _close(getattr(a, op)(0.5).numpy(), ref(x, x.dtype.type(0.5)), dtype)
    # non-contiguous operands (transposed, broadcast)
    if len(shape) == 2:
        _close(getattr(a.permute((1, 0)), op)(b.permute((1, 0))).numpy(), ref(x.T, y.T), dtype)
        _close(getattr(a, op)(b[:1].broadcast_to(shape)).numpy(),
               ref(x, np.broadcast_to(y[:1], shape)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pow_and_unary(dtype):
    x = _rand((1023,), dtype, positive=True)
    a = _gpu(x)
    _close((a ** 2.5).numpy(), x ** x.dtype.type(2.5), dtype)
    _close((a ** _gpu(x)).numpy(), x ** x, dtype)
    for name, f in [("log", np.log), ("exp", np.exp), ("tanh", np.tanh), ("sqrt", np.sqrt),
                    ("abs", np.abs), ("sin", np.sin), ("cos", np.cos)]:
        _close(getattr(a, name)().numpy(), f(x), dtype)
    _close((-a).numpy(), -x, dtype)


def test_integer_and_bool_paths_use_numpy_semantics():
    x = np.arange(-5, 7, dtype=np.int32).reshape(3, 4)
    a = _gpu(x)
    np.testing.assert_array_equal((a + 3).numpy(), x + 3)
    np.testing.assert_array_equal((a * a).numpy(), x * x)
    np.testing.assert_allclose((a / 2).numpy(), x / 2)
    np.testing.assert_array_equal((a > 0).numpy(), x > 0)
    np.testing.assert_array_equal(a.sum(axis=1).numpy(), x.sum(axis=1))
    np.testing.assert_array_equal(a.max(axis=0).numpy(), x.max(axis=0))
    np.testing.assert_array_equal((-a).abs().numpy(), np.abs(x))


@pytest.mark.parametrize("src,dst", [("float32", "float16"), ("float16", "float64"),
                                     ("float32", "int32"), ("int64", "float16"),
                                     ("float32", "bool"), ("bool", "float32")])
def test_astype(src, dst):
    x = (_rand((4, 33)) * 10).astype(src)
    np.testing.assert_array_equal(_gpu(x).astype(dst).numpy(), x.astype(dst))


def test_where():
    c = np.random.rand(5, 7) > 0.5
    x, y = _rand((5, 7)), _rand((1, 7))
    got = ndl.backend_ndarray.where(_gpu(c), _gpu(x), _gpu(y))
    np.testing.assert_array_equal(got.numpy(), np.where(c, x, y))


@pytest.mark.parametrize("mode", ["cublas", "tiled", "naive"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", [((1, 1), (1, 1)), ((3, 5), (5, 2)), ((129, 67), (67, 131)),
                                    ((4, 3, 257, 9), (4, 3, 9, 130)), ((2, 3, 0), (0, 4)),
                                    ((0, 5), (5, 3)), ((5, 17, 33), (33, 1))], ids=str)
def test_matmul(mode, dtype, shapes):
    from needle.backend_cuda import ndarray_backend_cuda as mod
    x, y = _rand(shapes[0], dtype), _rand(shapes[1], dtype)
    old = mod.get_matmul_kernel()
    mod.set_matmul_kernel(mode)
    try:
        got = (_gpu(x) @ _gpu(y)).numpy()
    finally:
        mod.set_matmul_kernel(old)
    want = x.astype(np.float64) @ y.astype(np.float64)
    tol = {"float16": 1e-2, "float32": 1e-4, "float64": 1e-10}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * shapes[0][-1])


def test_matmul_transposed_operands():
    x, y = _rand((64, 200)), _rand((300, 64))
    got = (_gpu(x).permute((1, 0)) @ _gpu(y).permute((1, 0))).numpy()
    np.testing.assert_allclose(got, x.T @ y.T, rtol=1e-4, atol=1e-3)


# Sizes the emulator runs in seconds that still take every reduce launch on this device: one
# thread per row (32 * SMs rows or more, of <= 32), one block per row, two passes (few long rows).
SMS = rt.num_sms(0) if ndl.cuda().enabled() else 132
REDUCTIONS = [((1,), None), ((100003,), None), ((3, 5000), 1), ((32 * SMS, 3), 1),
              ((5000, 7), 0), ((2, 3, 4, 5), (0, 2)), ((2, 1, 3, 1, 2, 3, 2), (1, 3, 6)),
              ((3, 0, 2), 2), ((7, 20000), 1), ((300, 40), 1)]


def test_reduction_sizes_take_every_launch():  # the course's reduce.cu
    launches = set()
    for shape, axes in REDUCTIONS:
        axes = range(len(shape)) if axes is None else np.atleast_1d(axes)
        size = int(np.prod([shape[i] for i in axes]))
        rows = int(np.prod(shape)) // max(size, 1)
        if rows and size:
            launch = K.reduce_launch(rows, size, SMS)
            launches.add((launch["kind"], launch["chunks"] > 1))
    assert launches == {("thread", False), ("block", False), ("block", True)}


# The course's reduce.cu (graded: hw3.cuda.backend) and the backend's default reduce_fast.cu
# (not in a student release); middle axes: reduce.cu after a transposed copy, reduce_fast.cu's
# column kernel in place.
REDUCE_MODES = ["course"] + (["fast"] if "reduce_fast.cu" in K.KERNEL_FILES else [])
FAST_REDUCTIONS = [((5, 7), 1), ((3, 4097), 1), ((2, 40000), 1), ((600, 5000), 1),
                   ((6, 9, 70), 1), ((300, 5), 0), ((2, 3, 4, 5), (0, 2)), ((7, 33, 3), 2)]


@pytest.fixture(params=REDUCE_MODES)
def reduce_mode(request):
    from needle.backend_cuda import ndarray_backend_cuda as mod
    old = mod.get_reduce_kernel()
    mod.set_reduce_kernel(request.param)
    yield request.param
    mod.set_reduce_kernel(old)


def test_fast_reduction_sizes_take_every_launch():
    launches = set()
    for shape, axes in FAST_REDUCTIONS:
        axes = np.atleast_1d(axes)
        size = int(np.prod([shape[i] for i in axes]))
        inner = int(np.prod(shape[max(axes) + 1:])) if len(axes) == 1 else 1
        outer = int(np.prod(shape)) // size // inner
        launch = K.fast_reduce_launch(outer, size, inner, 4, SMS)
        launches.add((launch["kind"], launch["chunks"] > 1))
    assert launches == {("rows_warp", False), ("rows_wide", False), ("rows_wide", True),
                     ("cols", False)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axes", REDUCTIONS + FAST_REDUCTIONS, ids=str)
def test_reductions(dtype, shape, axes, reduce_mode):
    x = _rand(shape, dtype)
    a = _gpu(x)
    tol = TOL[dtype] * max(10, np.sqrt(x.size))
    np.testing.assert_allclose(a.sum(axis=axes).numpy().astype(np.float64),
                               x.astype(np.float64).sum(axis=axes), rtol=tol, atol=tol)
    if x.size and all(x.shape[i] for i in (range(x.ndim) if axes is None else
                                            np.atleast_1d(axes))):
        np.testing.assert_array_equal(a.max(axis=axes, keepdims=True).numpy(),
                                      x.max(axis=axes, keepdims=True))


def test_reduce_max_propagates_nan_and_sum_of_empty_is_zero(reduce_mode):
    x = np.array([[1.0, np.nan, 3.0], [-np.inf, -np.inf, -np.inf]], dtype=np.float32)
    np.testing.assert_array_equal(_gpu(x).max(axis=1).numpy(), x.max(axis=1))
    np.testing.assert_array_equal(_gpu(x.T.copy()).max(axis=0).numpy(), x.max(axis=1))
    np.testing.assert_array_equal(_gpu(np.zeros((3, 0), np.float32)).sum(axis=1).numpy(),
                                  np.zeros(3, np.float32))


def test_bfloat16_roundtrip_ops_and_matmul():
    if rt.compute_capability(0) < 80:
        with pytest.raises(TypeError, match="compute capability"):
            _gpu(np.ones(3, np.float32), "bfloat16")
        return
    x, y = _rand((65, 33)), _rand((33, 17))
    a, b = _gpu(x, "bfloat16"), _gpu(y, "bfloat16")
    xb = a.numpy().astype(np.float32)  # the bf16-rounded values
    yb = b.numpy().astype(np.float32)
    assert a.dtype == "bfloat16"
    _close((a + a).numpy().astype(np.float32), xb + xb, "bfloat16")
    _close(a.exp().numpy().astype(np.float32), np.exp(xb), "bfloat16")
    _close(a.sum(axis=1).numpy().astype(np.float32), xb.sum(axis=1), "bfloat16")
    _close((a @ b).numpy().astype(np.float32), xb @ yb, "bfloat16")
    np.testing.assert_array_equal(a.astype("float32").numpy(), xb)


def test_fill_and_full():
    for dt in ["float32", "float16", "int64", "bool"]:
        a = ndl.cuda().full((3, 257), 3, dtype=dt)
        np.testing.assert_array_equal(a.numpy(), np.full((3, 257), 3, dtype=dt))


def test_device_moves():
    x = _rand((4, 5))
    g = NDArray(x).to(ndl.cuda())
    assert g.device == ndl.cuda()
    np.testing.assert_array_equal(g.to(ndl.cpu()).numpy(), x)
    t = ndl.Tensor(x, device=ndl.cuda())
    assert t.device == ndl.cuda()
    np.testing.assert_array_equal((t * 2).numpy(), x * 2)


def test_memory_stats_track_allocations():
    from needle.backend_cuda import memory_stats, reset_peak_memory
    reset_peak_memory(0)
    before = memory_stats(0)["bytes_in_use"]
    a = ndl.cuda().empty((1 << 20,), dtype="float32")
    during = memory_stats(0)
    assert during["bytes_in_use"] - before >= 4 << 20
    assert during["peak_bytes_in_use"] >= during["bytes_in_use"]
    del a
    after = memory_stats(0)
    assert after["bytes_in_use"] <= during["bytes_in_use"] - (4 << 20)
    assert after["peak_bytes_in_use"] >= during["bytes_in_use"]


@pytest.mark.skipif(not ndl.cuda(1).enabled(), reason="needs two GPUs")
def test_second_gpu_runs_its_own_kernels():
    x = _rand((33, 65))
    a = NDArray(x, device=ndl.cuda(1))
    assert a._handle.array.device.id == 1
    np.testing.assert_allclose((a.permute((1, 0)).compact() * 2).numpy(), x.T * 2)
    np.testing.assert_allclose(a.sum(axis=1).numpy(), x.sum(axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("raw", ["fastest", "1", "nan"])
def test_an_unknown_reduce_kernel_is_refused_naming_where_it_was_asked(raw, monkeypatch):
    from needle.backend_cuda import ndarray_backend_cuda as mod
    monkeypatch.setenv("NEEDLE_CUDA_REDUCE", raw)
    with pytest.raises(ValueError, match=f"NEEDLE_CUDA_REDUCE='{raw}': unknown reduce kernel"):
        rt.reduce_mode_from_env()
    with pytest.raises(ValueError, match=r"set_reduce_kernel\('fastest'\): unknown reduce"):
        mod.set_reduce_kernel("fastest")

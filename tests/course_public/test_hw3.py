"""The course's hw3 public tests (tests/test_ndarray.py): the NDArray API with needle's NDArray.

The course's calls, shapes and tolerances, including its ``_ShapeAndSlices`` NDArray subclass
(built on ``process_slice``), ``_handle.ptr()`` for in-place checks, ``compare_strides`` and the
raw ``matmul_tiled`` primitive on the tiled layout. References are NumPy's.
"""
import numpy as np
import pytest

from needle import backend_ndarray as nd

_DEVICES = [nd.cpu(), pytest.param(nd.cuda(), marks=pytest.mark.skipif(
    not nd.cuda().enabled(), reason="No GPU"))]


def compare_strides(a_np, a_nd):
    size = a_np.itemsize
    assert tuple([x // size for x in a_np.strides]) == a_nd.strides


def check_same_memory(original, view):
    assert original._handle.ptr() == view._handle.ptr()


@pytest.mark.parametrize("params", [
    {"shape": (4, 4), "np_fn": lambda X: X.transpose(), "nd_fn": lambda X: X.permute((1, 0))},
    {"shape": (4, 1, 4), "np_fn": lambda X: np.broadcast_to(X, shape=(4, 5, 4)),
     "nd_fn": lambda X: X.broadcast_to((4, 5, 4))},
    {"shape": (4, 3), "np_fn": lambda X: X.reshape(2, 2, 3),
     "nd_fn": lambda X: X.reshape((2, 2, 3))},
    {"shape": (16, 16), "np_fn": lambda X: X.reshape(2, 4, 2, 2, 2, 2, 2),
     "nd_fn": lambda X: X.reshape((2, 4, 2, 2, 2, 2, 2))},
    {"shape": (2, 4, 2, 2, 2, 2, 2), "np_fn": lambda X: X.reshape(16, 16),
     "nd_fn": lambda X: X.reshape((16, 16))},
    {"shape": (8, 8), "np_fn": lambda X: X[4:, 4:], "nd_fn": lambda X: X[4:, 4:]},
    {"shape": (8, 8, 2, 2, 2, 2), "np_fn": lambda X: X[1:3, 5:8, 1:2, 0:1, 0:1, 1:2],
     "nd_fn": lambda X: X[1:3, 5:8, 1:2, 0:1, 0:1, 1:2]},
    {"shape": (7, 8), "np_fn": lambda X: X.transpose()[3:7, 2:5],
     "nd_fn": lambda X: X.permute((1, 0))[3:7, 2:5]},
], ids=["transpose", "broadcast_to", "reshape1", "reshape2", "reshape3", "getitem1",
        "getitem2", "transposegetitem"])
@pytest.mark.parametrize("device", _DEVICES)
def test_compact(params, device):
    shape, np_fn, nd_fn = params["shape"], params["np_fn"], params["nd_fn"]
    _A = np.random.randint(low=0, high=10, size=shape)
    A = nd.array(_A, device=device)
    lhs = nd_fn(A).compact()
    assert lhs.is_compact(), "array is not compact"
    rhs = np_fn(_A)
    np.testing.assert_allclose(lhs.numpy(), rhs, atol=1e-5, rtol=1e-5)


reduce_params = [{"dims": (10,), "axis": 0}, {"dims": (4, 5, 6), "axis": 0},
                 {"dims": (4, 5, 6), "axis": 1}, {"dims": (4, 5, 6), "axis": 2}]


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("params", reduce_params)
def test_reduce_sum(params, device):
    dims, axis = params["dims"], params["axis"]
    _A = np.random.randn(*dims)
    A = nd.array(_A, device=device)
    np.testing.assert_allclose(_A.sum(axis=axis, keepdims=True),
                               A.sum(axis=axis, keepdims=True).numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("params", reduce_params)
def test_reduce_max(params, device):
    dims, axis = params["dims"], params["axis"]
    _A = np.random.randn(*dims)
    A = nd.array(_A, device=device)
    np.testing.assert_allclose(_A.max(axis=axis, keepdims=True),
                               A.max(axis=axis, keepdims=True).numpy(), atol=1e-5, rtol=1e-5)


class _ShapeAndSlices(nd.NDArray):
    def __getitem__(self, idxs):
        idxs = tuple([self.process_slice(s, i) if isinstance(s, slice) else slice(s, s + 1, 1)
                      for i, s in enumerate(idxs)])
        return self.shape, idxs


def ShapeAndSlices(*shape):
    return _ShapeAndSlices(np.ones(shape))


@pytest.mark.parametrize("params", [
    {"lhs": ShapeAndSlices(4, 5, 6)[1:2, 0, 0], "rhs": ShapeAndSlices(7, 7, 7)[1:2, 0, 0]},
    {"lhs": ShapeAndSlices(4, 5, 6)[1:4:2, 0, 0], "rhs": ShapeAndSlices(7, 7, 7)[1:3, 0, 0]},
    {"lhs": ShapeAndSlices(4, 5, 6)[1:3, 2:5, 2:6], "rhs": ShapeAndSlices(7, 7, 7)[:2, :3, :4]},
])
@pytest.mark.parametrize("device", _DEVICES)
def test_setitem_ewise(params, device):
    lhs_shape, lhs_slices = params["lhs"]
    rhs_shape, rhs_slices = params["rhs"]
    _A = np.random.randn(*lhs_shape)
    _B = np.random.randn(*rhs_shape)
    A = nd.array(_A, device=device)
    B = nd.array(_B, device=device)
    start_ptr = A._handle.ptr()
    A[lhs_slices] = B[rhs_slices]
    _A[lhs_slices] = _B[rhs_slices]
    end_ptr = A._handle.ptr()
    assert start_ptr == end_ptr, "you should modify in-place"
    compare_strides(_A, A)
    np.testing.assert_allclose(A.numpy(), _A, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("params", [ShapeAndSlices(4, 5, 6)[1, 2, 3],
                                    ShapeAndSlices(4, 5, 6)[1:4, 2, 3],
                                    ShapeAndSlices(4, 5, 6)[:4, 2:5, 3],
                                    ShapeAndSlices(4, 5, 6)[1::2, 2:5, ::2]])
@pytest.mark.parametrize("device", _DEVICES)
def test_setitem_scalar(params, device):
    shape, slices = params
    _A = np.random.randn(*shape)
    A = nd.array(_A, device=device)
    start_ptr = A._handle.ptr()
    _A[slices] = 4.0
    A[slices] = 4.0
    end_ptr = A._handle.ptr()
    assert start_ptr == end_ptr, "you should modify in-place"
    np.testing.assert_allclose(A.numpy(), _A, atol=1e-5, rtol=1e-5)
    compare_strides(_A, A)


@pytest.mark.parametrize("m,n,p", [(1, 1, 1), (2, 2, 3), (1, 2, 1), (3, 3, 3)])
def test_matmul_tiled(m, n, p):
    device = nd.cpu()
    assert hasattr(device, "matmul_tiled")
    t = device.__tile_size__
    A = nd.array(np.random.randn(m, n, t, t), device=nd.cpu())
    B = nd.array(np.random.randn(n, p, t, t), device=nd.cpu())
    C = nd.NDArray.make((m, p, t, t), device=nd.cpu())
    device.matmul_tiled(A._handle, B._handle, C._handle, m * t, n * t, p * t)
    lhs = A.numpy().transpose(0, 2, 1, 3).flatten().reshape(m * t, n * t) \
        @ B.numpy().transpose(0, 2, 1, 3).flatten().reshape(n * t, p * t)
    rhs = C.numpy().transpose(0, 2, 1, 3).flatten().reshape(m * t, p * t)
    np.testing.assert_allclose(lhs, rhs, atol=1e-5, rtol=1e-3)


OPS = {"multiply": lambda a, b: a * b, "divide": lambda a, b: a / b,
       "add": lambda a, b: a + b, "subtract": lambda a, b: a - b,
       "equal": lambda a, b: a == b, "greater_than": lambda a, b: a >= b}
OP_FNS = [OPS[k] for k in OPS]
OP_NAMES = [k for k in OPS]
ewise_shapes = [(1, 1, 1), (4, 5, 6)]


@pytest.mark.parametrize("fn", OP_FNS, ids=OP_NAMES)
@pytest.mark.parametrize("shape", ewise_shapes)
@pytest.mark.parametrize("device", _DEVICES)
def test_ewise_fn(fn, shape, device):
    _A = np.random.randn(*shape)
    _B = np.random.randn(*shape)
    A = nd.array(_A, device=device)
    B = nd.array(_B, device=device)
    np.testing.assert_allclose(fn(_A, _B), fn(A, B).numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", ewise_shapes)
@pytest.mark.parametrize("device", _DEVICES)
def test_ewise_max(shape, device):
    _A = np.random.randn(*shape)
    _B = np.random.randn(*shape)
    A = nd.array(_A, device=device)
    B = nd.array(_B, device=device)
    np.testing.assert_allclose(np.maximum(_A, _B), A.maximum(B).numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", OP_FNS, ids=OP_NAMES)
@pytest.mark.parametrize("shape", ewise_shapes)
@pytest.mark.parametrize("device", _DEVICES)
def test_scalar_fn(fn, shape, device):
    _A = np.random.randn(*shape)
    _B = np.random.randn(1)[0]
    A = nd.array(_A, device=device)
    np.testing.assert_allclose(fn(_A, _B), fn(A, _B).numpy(), atol=1e-5, rtol=1e-5)


matmul_dims = [(16, 16, 16), (8, 8, 8), (1, 2, 3), (3, 4, 5), (5, 4, 3), (16, 16, 32),
               (64, 64, 64), (72, 72, 72), (72, 73, 74), (74, 73, 72), (128, 128, 128)]


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("m,n,p", matmul_dims)
def test_matmul(m, n, p, device):
    _A = np.random.randn(m, n)
    _B = np.random.randn(n, p)
    A = nd.array(_A, device=device)
    B = nd.array(_B, device=device)
    np.testing.assert_allclose((A @ B).numpy(), _A @ _B, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", _DEVICES)
def test_scalar_ops(device):
    A = np.random.randn(5, 5)
    B = nd.array(A, device=device)
    np.testing.assert_allclose(A * 5., (B * 5.).numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(A / 5., (B / 5.).numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.power(A, 5.), (B ** 5.).numpy(), atol=1e-5, rtol=1e-5)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(np.power(A, 0.5), (B ** 0.5).numpy(), atol=1e-5, rtol=1e-5)
    C = (np.max(A) + 1.).item()
    np.testing.assert_allclose(np.maximum(A, C), (B.maximum(C)).numpy(), atol=1e-5, rtol=1e-5)
    C = (np.max(A) - 1.).item()
    np.testing.assert_allclose(np.maximum(A, C), (B.maximum(C)).numpy(), atol=1e-5, rtol=1e-5)
    C = A[0, 1].item()
    np.testing.assert_allclose(A == C, (B == C).numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(A >= C, (B >= C).numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", _DEVICES)
def test_ewise_unary(device):
    A = np.abs(np.random.randn(5, 5))
    B = nd.array(A, device=device)
    np.testing.assert_allclose(np.log(A), (B.log()).numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.exp(A), (B.exp()).numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.tanh(A), (B.tanh()).numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("fn", [lambda X: X[3:4, 3:4], lambda X: X[1:2, 1:3],
                                lambda X: X[3:4, 1:4], lambda X: X[1:4, 3:4]])
def test_getitem(device, fn):
    _A = np.random.randn(5, 5)
    A = nd.array(_A, device=device)
    lhs = fn(_A)
    rhs = fn(A)
    np.testing.assert_allclose(lhs, rhs.numpy(), atol=1e-5, rtol=1e-5)
    check_same_memory(A, rhs)


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("shape,new", [((1, 1, 1), (3, 3, 3)), ((4, 1, 6), (4, 6, 6))])
def test_broadcast_to(device, shape, new):
    _A = np.random.randn(*shape)
    A = nd.array(_A, device=device)
    lhs = np.broadcast_to(_A, shape=new)
    rhs = A.broadcast_to(new)
    np.testing.assert_allclose(lhs, rhs.numpy(), atol=1e-5, rtol=1e-5)
    check_same_memory(A, rhs)


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("shape,new", [((1, 1, 1), (1,)), ((4, 1, 6), (6, 4, 1))])
def test_reshape(device, shape, new):
    _A = np.random.randn(*shape)
    A = nd.array(_A, device=device)
    np.testing.assert_allclose(_A.reshape(*new), A.reshape(new).numpy(), atol=1e-5, rtol=1e-5)
    check_same_memory(A, A.reshape(new))


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("dims,axes", [((4, 5, 6), (0, 1, 2)), ((4, 5, 6), (1, 0, 2)),
                                       ((4, 5, 6), (2, 1, 0))])
def test_permute(device, dims, axes):
    _A = np.random.randn(*dims)
    A = nd.array(_A, device=device)
    lhs = np.transpose(_A, axes=axes)
    rhs = A.permute(axes)
    np.testing.assert_allclose(lhs, rhs.numpy(), atol=1e-5, rtol=1e-5)
    check_same_memory(A, rhs)


def test_float32_is_the_ndarray_default():
    """The course's NDArray is float32: the default from Python data and for new arrays."""
    assert nd.array([[1.0, 2.0]]).dtype == "float32"
    assert nd.NDArray.make((2, 2), device=nd.cpu()).dtype == "float32"
    assert nd.array(np.ones(3), dtype="float32").dtype == "float32"

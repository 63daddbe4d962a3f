"""The ``np`` backend (needle/backend_numpy.py): hw1/hw2's ops on plain NumPy arrays.

Each op written once runs on both backends; in ``np`` mode nothing goes through needle's
strided NDArray (hw3's exercises), and a Python list of floats is float64, as in hw1.
"""
import numpy as np
import pytest

import needle as ndl
from needle.backend_ndarray import NDArray
from needle.backend_numpy import NumpyArray
from needle.backend_selection import use_backend

# the NDArray methods and CPU primitives holding hw3's solution regions (views, setitem,
# reductions, matmul, flip, gather/scatter)
HW3_METHODS = ("reshape", "permute", "broadcast_to", "flip", "_view_of", "__setitem__",
               "__matmul__", "_reduce", "_reduce_consecutive")
HW3_PRIMITIVES = ("compact", "ewise_setitem", "scalar_setitem", "matmul", "matmul_tiled",
                  "reduce_sum", "reduce_max", "take_rows", "scatter_add_rows")


def _graph(x: ndl.Tensor, w: ndl.Tensor) -> ndl.Tensor:
    """Every hw1 op once: a scalar loss whose backward runs every gradient."""
    h = ndl.relu(ndl.matmul(x, w)) + ndl.tanh(ndl.transpose(ndl.matmul(x, w)).transpose())
    h = ndl.broadcast_to(ndl.reshape(ndl.summation(h, axes=(0,)), (1, 3)), (4, 3))
    h = ndl.divide(ndl.power_scalar(ndl.exp(h * 0.01), 2), ndl.log(ndl.exp(h * 0.01) + 2.0))
    h = ndl.multiply(h, ndl.divide_scalar(ndl.power(ndl.exp(h * 0.1), h * 0 + 2.0), 3.0))
    return ndl.summation(ndl.logsumexp(h, axes=(1,)))


def _run(backend: str) -> tuple:
    rng = np.random.default_rng(0)
    xs, ws = rng.uniform(0.5, 1.5, (4, 5)), rng.uniform(-1, 1, (5, 3))
    with use_backend(backend):
        x, w = ndl.Tensor(xs), ndl.Tensor(ws)
        loss = _graph(x, w)
        loss.backward()
        return loss, x, w


def test_np_mode_data_is_a_numpy_array_and_lists_are_float64():
    with use_backend("np"):
        t = ndl.Tensor([[1.5, 2.0], [3.0, 4.0]])
        data = t.realize_cached_data()
        assert isinstance(data, np.ndarray) and not isinstance(data, NDArray)
        assert t.dtype == "float64" and ndl.Tensor([6]).dtype == "float64"
        assert ndl.Tensor(np.ones(3, dtype=np.float32)).dtype == "float32"  # NumPy data keeps
        assert ndl.Tensor([1.0], dtype="float32").dtype == "float32"
        assert isinstance((t @ t).realize_cached_data(), NumpyArray)
        assert type(t.numpy()) is np.ndarray and t.device == ndl.cpu()
        assert ndl.init.rand(2, 3).dtype == "float32"  # parameters stay float32
        assert isinstance(ndl.init.rand(2, 3).realize_cached_data(), NumpyArray)
    assert ndl.Tensor([[1.5, 2.0]]).dtype == "float32"  # nd mode (the default) unchanged
    assert isinstance(ndl.Tensor([1.0]).realize_cached_data(), NDArray)


def test_np_mode_runs_no_ndarray_method(monkeypatch):
    """hw1's ops forward and backward, logsumexp and a layer on NumPy arrays, with every
    NDArray method that holds a hw3 exercise made to fail."""
    def failing(name: str):
        def fail(*args, **kwargs):
            raise AssertionError(f"np mode called {name}")
        return fail
    for name in HW3_METHODS:
        monkeypatch.setattr(NDArray, name, failing(f"NDArray.{name}"))
    for name in HW3_PRIMITIVES:  # BackendDevice holds its module's primitives as attributes
        monkeypatch.setattr(ndl.cpu(), name, failing(f"the cpu primitive {name}"))
    loss, x, w = _run("np")
    assert isinstance(x.grad.realize_cached_data(), NumpyArray)
    with use_backend("np"):
        layer = ndl.nn.Linear(5, 3)
        ndl.nn.SoftmaxLoss()(layer(x), ndl.Tensor([0, 1, 2, 0])).backward()
        assert layer.weight.grad.shape == (5, 3)
    with pytest.raises(AssertionError, match="np mode called"):
        _run("nd")  # the check itself bites: nd mode goes through those methods


def test_each_op_written_once_agrees_on_both_backends():
    loss_np, x_np, w_np = _run("np")
    loss_nd, x_nd, w_nd = _run("nd")
    assert loss_np.dtype == x_np.grad.dtype == "float64"  # float64 NumPy data, kept
    np.testing.assert_allclose(loss_np.numpy(), loss_nd.numpy(), rtol=1e-12)
    np.testing.assert_allclose(x_np.grad.numpy(), x_nd.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(w_np.grad.numpy(), w_nd.grad.numpy(), rtol=1e-12)


def test_np_mode_lives_on_the_host():
    with use_backend("np"):
        with pytest.raises(ValueError, match="NEEDLE_BACKEND=np .*cuda"):
            ndl.Tensor([1.0], device=ndl.cuda())
        x = ndl.Tensor([1.0, 2.0])
        assert x.realize_cached_data().to(ndl.cpu()) is x.realize_cached_data()


def test_np_mode_converts_an_ndarray_given_to_it():
    nd = NDArray(np.arange(6.0).reshape(2, 3), dtype="float64")
    with use_backend("np"):
        t = ndl.Tensor(nd)
        const = ndl.Tensor.make_const(nd)
        assert isinstance(t.realize_cached_data(), NumpyArray)
        assert isinstance(const.realize_cached_data(), NumpyArray)
        np.testing.assert_array_equal((t + const).numpy(), 2 * nd.numpy())


def test_numpy_array_methods_match_ndarray():
    base = np.arange(24.0).reshape(2, 3, 4)
    a, b = base.view(NumpyArray), NDArray(base, dtype="float64")
    for got, want in [(a.permute((2, 0, 1)), b.permute((2, 0, 1))),
                      (a[:, :1].broadcast_to((2, 3, 4)), b[:, :1].broadcast_to((2, 3, 4))),
                      (a.permute((1, 0, 2)).compact(), b.permute((1, 0, 2)).compact()),
                      (a.flip((0, 2)), b.flip((0, 2))), (a.pad(((1, 0), (0, 0), (0, 2))),
                                                         b.pad(((1, 0), (0, 0), (0, 2)))),
                      (a.maximum(5.0), b.maximum(5.0)), (a.exp().log(), b.exp().log()),
                      (a.sqrt(), b.sqrt()), (a.tanh(), b.tanh())]:
        assert isinstance(got, NumpyArray)
        np.testing.assert_allclose(got.numpy(), want.numpy())
    assert a.permute((1, 0, 2)).compact().is_compact() and not a.permute((1, 0, 2)).is_compact()
    assert a._np_dtype == b._np_dtype

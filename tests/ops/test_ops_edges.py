"""Edge cases where needle must agree with PyTorch: zero-size axes, mixed dtypes, and the cost
of splitting (the differential test, ``test_differential.py``, found each of them)."""
from typing import Any, Iterator

import numpy as np
import pytest
from helpers import DEVICES

import needle as ndl


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 0), (0, 4)), ((0, 3, 2), (2, 4)),
                                             ((2, 0, 2), (2, 4))])
def test_batched_matmul_with_a_zero_size_axis_has_zero_gradients(
        device: Any, a_shape: tuple, b_shape: tuple) -> None:
    a = ndl.Tensor(np.ones(a_shape), device=device, dtype="float64")
    b = ndl.Tensor(np.ones(b_shape), device=device, dtype="float64")
    out = a @ b
    assert out.shape == a_shape[:-1] + b_shape[-1:]
    out.sum().backward()
    assert a.grad.shape == a_shape and b.grad.shape == b_shape
    np.testing.assert_array_equal(a.grad.numpy(), np.zeros(a_shape))
    np.testing.assert_array_equal(b.grad.numpy(), np.zeros(b_shape))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_logsumexp_over_a_zero_size_axis_is_minus_inf(device: Any, dtype: str) -> None:
    for axes, shape in (((1,), (2,)), (None, ()), ((0, 1), ())):
        x = ndl.Tensor(np.zeros((2, 0)), device=device, dtype=dtype)
        y = ndl.ops.logsumexp(x, axes)
        assert y.shape == shape and y.dtype == dtype
        np.testing.assert_array_equal(y.numpy(), np.full(shape, -np.inf))
        y.sum().backward()
        assert x.grad.shape == (2, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["logsoftmax", "softmax"])
def test_logsoftmax_over_a_zero_size_axis_is_empty(device: Any, op: str) -> None:
    x = ndl.Tensor(np.zeros((3, 0)), device=device, dtype="float64")
    y = getattr(ndl.ops, op)(x, axis=1)
    assert y.shape == (3, 0) and y.dtype == "float64"
    y.sum().backward()
    assert x.grad.shape == (3, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a_dtype,b_dtype", [("float32", "float64"), ("float64", "float32")])
def test_power_gradients_in_the_promoted_dtype(device: Any, a_dtype: str, b_dtype: str) -> None:
    """d(a**b)/db = a**b * log(a) and d(a**b)/da = b * a**(b-1) computed in float64 when one
    operand is float64 (then cast to each input's dtype), as PyTorch computes them."""
    a_np = np.array([1.5, 2.5, 0.75, 3.25])  # exact in float32 and float64
    b_np = np.array([1.1, 2.3, -0.7, 0.4]).astype(b_dtype).astype(np.float64)
    a = ndl.Tensor(a_np, device=device, dtype=a_dtype)
    b = ndl.Tensor(b_np, device=device, dtype=b_dtype)
    (a ** b).sum().backward()
    assert a.grad.dtype == a_dtype and b.grad.dtype == b_dtype
    tol = {"float32": 1e-7, "float64": 1e-13}
    np.testing.assert_allclose(b.grad.numpy(), a_np ** b_np * np.log(a_np), rtol=tol[b_dtype])
    np.testing.assert_allclose(a.grad.numpy(), b_np * a_np ** (b_np - 1), rtol=tol[a_dtype])


@pytest.fixture
def nodes_built(monkeypatch: pytest.MonkeyPatch) -> Iterator[list]:
    """A one-element list counting every graph node (and constant) created while it is live."""
    count = [0]
    init = ndl.autograd.Value._init

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        count[0] += 1
        init(self, *args, **kwargs)
    monkeypatch.setattr(ndl.autograd.Value, "_init", counting_init)
    yield count


def _split_backward_nodes(n: int, count: list) -> int:
    """Nodes created by the backward pass of a split of an (n, 2) tensor into n pieces."""
    x = ndl.Tensor(np.ones((n, 2)), dtype="float64")
    loss = None
    for piece in ndl.ops.split(x, 0):
        loss = piece.sum() if loss is None else loss + piece.sum()
    before = count[0]
    loss.backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.ones((n, 2)))
    return count[0] - before


def test_split_backward_builds_linear_work(nodes_built: list) -> None:
    """Each piece's gradient is its own element, not a tuple of n zeros but one (n^2 nodes)."""
    small, large = (_split_backward_nodes(n, nodes_built) for n in (50, 400))
    assert large <= 8 * small + 50, f"backward nodes: {small} at n=50, {large} at n=400"
    assert large <= 12 * 400, f"{large} nodes for 400 pieces"


def test_split_backward_with_unused_pieces(nodes_built: list) -> None:
    """Pieces no loss uses get zero gradients (the tuple's adjoint fills them in)."""
    x = ndl.Tensor(np.arange(12.0).reshape(4, 3), dtype="float64")
    pieces = ndl.ops.split(x, 0)
    (pieces[1] * 2 + pieces[3] + pieces[1]).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0] * 3, [3] * 3, [0] * 3, [1] * 3])

"""The fused layer_norm op: values and gradients against NumPy, torch and the composed layer."""
import numpy as np
import pytest
from helpers import DEVICES, check_op_gradient

import needle as ndl
from needle import nn, ops


def np_layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """The definition, in NumPy (biased variance over the last axis)."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


SHAPES = [(3, 5), (2, 3, 4), (1, 7)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_matches_numpy(device, shape):
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal(shape), rng.standard_normal(shape[-1]), rng.standard_normal(
        shape[-1])
    got = ops.layer_norm(*(ndl.Tensor(a, device=device) for a in (x, w, b)))
    np.testing.assert_allclose(got.numpy(), np_layer_norm(x, w, b), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gradients_match_central_differences(device, shape):
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(shape), rng.standard_normal(shape[-1]),
              rng.standard_normal(shape[-1])]
    check_op_gradient(ops.layer_norm, np_layer_norm, arrays, device, rng)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_layer_equals_composed_layer(device):
    """LayerNorm1d(fused=True) and the course's composed LayerNorm1d agree, gradients too."""
    rng = np.random.default_rng(3)
    x, dy, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((6, 8), (6, 8), 8, 8))
    results = []
    for fused in (False, True):
        layer = nn.LayerNorm1d(8, device=device, fused=fused)
        layer.weight.data = ndl.Tensor(w, device=device)
        layer.bias.data = ndl.Tensor(b, device=device)
        xt = ndl.Tensor(x, device=device)
        y = layer(xt)
        (y * ndl.Tensor(dy, device=device)).sum().backward()
        results.append([y.numpy(), xt.grad.numpy(), layer.weight.grad.numpy(),
                        layer.bias.grad.numpy()])
    for composed, fused in zip(*results):
        np.testing.assert_allclose(fused, composed, rtol=1e-4, atol=1e-5)


def test_against_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 5, 16)).astype(np.float32)
    tl = torch.nn.LayerNorm(16)
    with torch.no_grad():
        tl.weight.copy_(torch.tensor(rng.standard_normal(16).astype(np.float32)))
        tl.bias.copy_(torch.tensor(rng.standard_normal(16).astype(np.float32)))
    tx = torch.tensor(x, requires_grad=True)
    tl(tx).pow(2).sum().backward()
    nx = ndl.Tensor(x)
    nw, nb = ndl.Tensor(tl.weight.detach().numpy()), ndl.Tensor(tl.bias.detach().numpy())
    y = ops.layer_norm(nx, nw, nb)
    (y * y).sum().backward()
    np.testing.assert_allclose(y.numpy(), tl(tx).detach().numpy(), rtol=1e-4, atol=1e-5)
    for mine, ref in ((nx, tx), (nw, tl.weight), (nb, tl.bias)):
        np.testing.assert_allclose(mine.grad.numpy(), ref.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_bad_shapes_name_them():
    x = ndl.Tensor(np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"weight \(3,\).*\(4,\).*\(2, 4\)"):
        ops.layer_norm(x, ndl.Tensor(np.ones(3)), ndl.Tensor(np.ones(4)))


def test_double_backward_is_refused_clearly():
    x = ndl.Tensor(np.random.default_rng(5).standard_normal((2, 3)))
    w, b = ndl.Tensor(np.ones(3)), ndl.Tensor(np.zeros(3))
    (ops.layer_norm(x, w, b) ** 3).sum().backward()
    with pytest.raises(NotImplementedError, match="double backward"):
        x.grad.sum().backward()

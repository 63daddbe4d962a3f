"""nn.Conv: NCHW convolution against torch and float64 central differences."""
import math

import numpy as np
import pytest
from helpers import DEVICES
from nn_helpers import assert_close, module_gradcheck

import needle as ndl
from needle import nn

pytestmark = pytest.mark.hw4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stride,bias", [(1, True), (2, False)])
def test_conv_gradcheck(stride, bias, device):
    np.random.seed(0)
    conv = nn.Conv(2, 2, 3, stride=stride, bias=bias, device=device, dtype="float64")
    module_gradcheck(conv, conv, [np.random.randn(1, 2, 5, 4)], device)


@pytest.mark.torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k,stride", [(3, 1), (3, 2), (1, 1), (5, 2)])
def test_conv_matches_torch(k, stride, device):
    torch = pytest.importorskip("torch")
    np.random.seed(1)
    conv = nn.Conv(3, 4, k, stride=stride, device=device)
    x = np.random.randn(2, 3, 9, 8).astype("float32")
    xt = ndl.Tensor(x, device=device)
    out = conv(xt)
    w = np.random.randn(*out.shape)
    (out * ndl.Tensor(w, device=device)).sum().backward()
    Wr = torch.tensor(conv.weight.numpy().transpose(3, 2, 0, 1), requires_grad=True)
    br = torch.tensor(conv.bias.numpy(), requires_grad=True)
    xr = torch.tensor(x, requires_grad=True)
    outr = torch.nn.functional.conv2d(xr, Wr, br, stride=stride, padding=k // 2)
    (outr * torch.tensor(w, dtype=torch.float32)).sum().backward()
    assert out.shape == tuple(outr.shape)
    assert_close(out, outr, rtol=1e-4, atol=1e-4)
    assert_close(xt.grad, xr.grad, rtol=1e-4, atol=1e-4)
    assert_close(conv.weight.grad, Wr.grad.permute(2, 3, 1, 0), rtol=1e-4, atol=1e-4)
    assert_close(conv.bias.grad, br.grad, rtol=1e-4, atol=1e-4)


def test_conv_init_and_errors():
    np.random.seed(0)
    conv = nn.Conv(16, 8, 3)
    w = conv.weight.numpy()
    assert w.shape == (3, 3, 16, 8) and conv.bias.shape == (8,)
    bound = math.sqrt(2) * math.sqrt(3 / (16 * 9))  # fan_in = K*K*C_in
    assert abs(w).max() <= bound and abs(w).max() > 0.95 * bound
    assert abs(conv.bias.numpy()).max() <= 1 / math.sqrt(16 * 9)
    assert nn.Conv(2, 3, (3, 3), bias=False).bias is None
    with pytest.raises(ValueError, match="NCHW"):
        conv(ndl.Tensor(np.zeros((1, 5, 5, 16))))

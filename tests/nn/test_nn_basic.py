"""Basic layers: forward/backward against torch, gradients against float64 central differences."""
import numpy as np
import pytest
from helpers import DEVICES
from nn_helpers import assert_close, module_gradcheck

import needle as ndl
from needle import nn

pytestmark = pytest.mark.hw2


def _t(a, device, dtype="float32", requires_grad=True):
    return ndl.Tensor(np.asarray(a), device=device, dtype=dtype, requires_grad=requires_grad)


def _weighted_backward(out, w, device):
    (out * _t(w, device, out.dtype, False)).sum().backward()


# ------------------------------------------------------------------ numerical gradients (float64)
GRADCHECK_CASES = {
    "linear": (lambda d: nn.Linear(3, 4, device=d, dtype="float64"), [(2, 3)]),
    "linear_nobias_3d": (lambda d: nn.Linear(3, 2, bias=False, device=d, dtype="float64"),
                         [(2, 2, 3)]),
    "layernorm": (lambda d: nn.LayerNorm1d(4, device=d, dtype="float64"), [(3, 4)]),
    "batchnorm1d": (lambda d: nn.BatchNorm1d(3, device=d, dtype="float64"), [(5, 3)]),
    "batchnorm2d": (lambda d: nn.BatchNorm2d(2, device=d, dtype="float64"), [(2, 2, 2, 3)]),
    "mlp": (lambda d: nn.Sequential(nn.Linear(3, 4, device=d, dtype="float64"), nn.Tanh(),
                                    nn.Residual(nn.Sequential(
                                        nn.Linear(4, 4, device=d, dtype="float64"), nn.GELU(),
                                        nn.Sigmoid(), nn.Identity())),
                                    nn.Flatten()), [(2, 3)]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(GRADCHECK_CASES))
def test_layer_gradcheck(case, device):
    make, shapes = GRADCHECK_CASES[case]
    np.random.seed(1)
    module = make(device)
    for p in module.parameters():  # move affine params off 1/0 so every term matters
        p.cached_data = ndl.Tensor(p.numpy() + np.random.randn(*p.shape) * 0.3, device=device,
                                   dtype="float64").realize_cached_data()
    inputs = [np.random.randn(*s) for s in shapes]
    module_gradcheck(module, module, inputs, device)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_loss_gradcheck(device):
    np.random.seed(2)
    lin = nn.Linear(4, 3, device=device, dtype="float64")
    y = _t([0, 2, 1, 2, 2], device, "int64", False)
    module_gradcheck(lambda x, y: nn.SoftmaxLoss()(lin(x), y), lin,
                     [np.random.randn(5, 4)], device, consts=[y])


# ------------------------------------------------------------------ against torch
torch = None


def _torch():
    global torch
    torch = pytest.importorskip("torch")
    return torch


@pytest.mark.torch
@pytest.mark.parametrize("device", DEVICES)
def test_linear_matches_torch(device):
    _torch()
    np.random.seed(0)
    lin = nn.Linear(5, 3, device=device)
    x = np.random.randn(4, 5).astype("float32")
    w = np.random.randn(4, 3)
    xt = _t(x, device)
    out = lin(xt)
    _weighted_backward(out, w, device)
    Wt = torch.tensor(lin.weight.numpy(), requires_grad=True)
    bt = torch.tensor(lin.bias.numpy(), requires_grad=True)
    xt_ = torch.tensor(x, requires_grad=True)
    ot = xt_ @ Wt + bt
    (ot * torch.tensor(w, dtype=torch.float32)).sum().backward()
    assert_close(out, ot)
    assert lin.weight.shape == (5, 3) and lin.bias.shape == (1, 3)
    for mine, ref in ((lin.weight.grad, Wt.grad), (lin.bias.grad, bt.grad), (xt.grad, xt_.grad)):
        assert_close(mine, ref)


@pytest.mark.torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["relu", "tanh", "sigmoid", "gelu"])
def test_activations_match_torch(name, device):
    _torch()
    mod = {"relu": nn.ReLU(), "tanh": nn.Tanh(), "sigmoid": nn.Sigmoid(), "gelu": nn.GELU()}[name]
    ref = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
           "gelu": lambda z: torch.nn.functional.gelu(z, approximate="tanh")}[name]
    x = np.random.randn(6, 7).astype("float32") * 3
    w = np.random.randn(6, 7)
    xt = _t(x, device)
    out = mod(xt)
    _weighted_backward(out, w, device)
    xr = torch.tensor(x, requires_grad=True)
    outr = ref(xr)
    (outr * torch.tensor(w, dtype=torch.float32)).sum().backward()
    assert_close(out, outr)
    assert_close(xt.grad, xr.grad)


@pytest.mark.torch
@pytest.mark.parametrize("device", DEVICES)
def test_softmax_loss_matches_torch(device):
    _torch()
    z = np.random.randn(8, 5).astype("float32") * 4
    y = np.random.randint(0, 5, size=8)
    zt = _t(z, device)
    loss = nn.SoftmaxLoss()(zt, _t(y, device, "int64", False))
    loss.backward()
    zr = torch.tensor(z, requires_grad=True)
    lr = torch.nn.functional.cross_entropy(zr, torch.tensor(y))
    lr.backward()
    assert loss.shape == ()
    assert_close(loss, lr)
    assert_close(zt.grad, zr.grad)
    with pytest.raises(ValueError, match="labels"):
        nn.SoftmaxLoss()(zt, _t(y[:3], device, "int64", False))


@pytest.mark.torch
@pytest.mark.parametrize("device", DEVICES)
def test_layernorm_matches_torch(device):
    _torch()
    x = np.random.randn(2, 3, 6).astype("float32")
    w = np.random.randn(2, 3, 6)
    ln = nn.LayerNorm1d(6, eps=1e-5, device=device)
    ln.weight.cached_data = ndl.Tensor(np.random.randn(6), device=device,
                                       dtype="float32").realize_cached_data()
    ref = torch.nn.LayerNorm(6, eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(ln.weight.numpy()))
    xt, xr = _t(x, device), torch.tensor(x, requires_grad=True)
    out, outr = ln(xt), ref(xr)
    _weighted_backward(out, w, device)
    (outr * torch.tensor(w, dtype=torch.float32)).sum().backward()
    assert_close(out, outr)
    assert_close(xt.grad, xr.grad)
    assert_close(ln.weight.grad, ref.weight.grad)
    assert_close(ln.bias.grad, ref.bias.grad)


@pytest.mark.torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [1, 2])
def test_batchnorm_train_eval_match_torch(dims, device):
    _torch()
    shape = (16, 4) if dims == 1 else (3, 4, 5, 2)
    axes = (0,) if dims == 1 else (0, 2, 3)
    bn = (nn.BatchNorm1d if dims == 1 else nn.BatchNorm2d)(4, momentum=0.2, device=device)
    ref = (torch.nn.BatchNorm1d if dims == 1 else torch.nn.BatchNorm2d)(4, momentum=0.2)
    x = (np.random.randn(*shape) * 2 + 1).astype("float32")
    w = np.random.randn(*shape)
    xt, xr = _t(x, device), torch.tensor(x, requires_grad=True)
    out, outr = bn(xt), ref(xr)
    _weighted_backward(out, w, device)
    (outr * torch.tensor(w, dtype=torch.float32)).sum().backward()
    assert_close(out, outr)  # training: normalize by batch stats with the biased variance
    assert_close(xt.grad, xr.grad)
    assert_close(bn.weight.grad, ref.weight.grad)
    assert_close(bn.bias.grad, ref.bias.grad)
    # running stats: mean as torch; var uses the biased batch variance (course), not unbiased
    assert_close(bn.running_mean, ref.running_mean)
    want_var = 0.8 * 1 + 0.2 * x.var(axis=axes)
    np.testing.assert_allclose(bn.running_var.numpy(), want_var, rtol=1e-5)
    bn.eval()
    x2 = np.random.randn(*shape).astype("float32")
    keep = (1, 4) if dims == 1 else (1, 4, 1, 1)
    want = (x2 - bn.running_mean.numpy().reshape(keep)) / np.sqrt(
        bn.running_var.numpy().reshape(keep) + 1e-5)
    mean_before = bn.running_mean.numpy()
    np.testing.assert_allclose(bn(_t(x2, device)).numpy(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(bn.running_mean.numpy(), mean_before)  # eval: no update


@pytest.mark.parametrize("device", DEVICES)
def test_layernorm_matches_numpy(device):
    """The layer's forward against Ba et al.'s formula in float64 NumPy (no PyTorch needed)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 6)).astype("float32") * 3 + 1
    ln = nn.LayerNorm1d(6, eps=1e-5, device=device)
    weight, bias = rng.standard_normal(6), rng.standard_normal(6)
    ln.weight.cached_data = _t(weight, device, requires_grad=False).realize_cached_data()
    ln.bias.cached_data = _t(bias, device, requires_grad=False).realize_cached_data()
    x64 = x.astype(np.float64)
    mean, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)  # biased variance
    want = (x64 - mean) / np.sqrt(var + 1e-5) * weight + bias
    np.testing.assert_allclose(ln(_t(x, device)).numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [1, 2])
def test_batchnorm_train_eval_match_numpy(dims, device):
    """Training normalizes by the batch's mean and biased variance and moves the running
    statistics by ``momentum``; eval normalizes by those (float64 NumPy, no PyTorch)."""
    rng = np.random.default_rng(2)
    shape, axes = ((16, 4), (0,)) if dims == 1 else ((3, 4, 5, 2), (0, 2, 3))
    keep = (1, 4) if dims == 1 else (1, 4, 1, 1)
    bn = (nn.BatchNorm1d if dims == 1 else nn.BatchNorm2d)(4, momentum=0.2, device=device)
    x = (rng.standard_normal(shape) * 2 + 1).astype("float32")
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axis=axes), x64.var(axis=axes)
    want = (x64 - mean.reshape(keep)) / np.sqrt(var.reshape(keep) + 1e-5)
    np.testing.assert_allclose(bn(_t(x, device)).numpy(), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.2 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), 0.8 + 0.2 * var, rtol=1e-5)
    bn.eval()
    x2 = rng.standard_normal(shape).astype("float32")
    want = (x2 - 0.2 * mean.reshape(keep)) / np.sqrt(0.8 + 0.2 * var.reshape(keep) + 1e-5)
    np.testing.assert_allclose(bn(_t(x2, device)).numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_statistics_and_eval(device):
    np.random.seed(5)
    p = 0.3
    drop = nn.Dropout(p)
    x = _t(np.ones((100, 100)) * 2.0, device)
    y = drop(x)
    ys = y.numpy()
    kept = ys != 0
    assert abs(1 - kept.mean() - p) < 0.02
    np.testing.assert_allclose(ys[kept], 2.0 / (1 - p), rtol=1e-6)
    assert abs(ys.mean() - 2.0) < 0.05  # inverted dropout keeps the expectation
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), kept / (1 - p), rtol=1e-6)
    drop.eval()
    np.testing.assert_array_equal(drop(x).numpy(), x.numpy())
    with pytest.raises(ValueError, match="Dropout p"):
        nn.Dropout(1.0)


def test_sequential_container_and_errors():
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    assert len(seq) == 2 and isinstance(seq[1], nn.ReLU) and list(seq)[0] is seq[0]
    with pytest.raises(ValueError, match=r"Linear\(2, 3\) got input of shape \(4, 5\)"):
        seq(ndl.Tensor(np.zeros((4, 5))))
    with pytest.raises(ValueError, match="BatchNorm1d"):
        nn.BatchNorm1d(3)(ndl.Tensor(np.zeros((4, 5))))


def test_linear_init_follows_course_rng_order():
    np.random.seed(0)
    lin = nn.Linear(7, 3)
    np.random.seed(0)
    bw = np.sqrt(2) * np.sqrt(3 / 7)
    want_w = np.random.rand(7, 3).astype("float32") * 2 * bw - bw
    bb = np.sqrt(2) * np.sqrt(3 / 3)
    want_b = (np.random.rand(3, 1).astype("float32") * 2 * bb - bb).reshape(1, 3)
    np.testing.assert_allclose(lin.weight.numpy(), want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lin.bias.numpy(), want_b, rtol=1e-5, atol=1e-6)

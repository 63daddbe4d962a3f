"""needle.amp: autocast policy, float32 master weights, GradScaler, memory and accuracy."""
import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.amp import GradScaler, autocast
from needle.memory import MemoryTracker
from needle.process_state import switches


def test_policy_dtypes_and_float32_grads():
    w = ndl.Tensor(np.random.randn(8, 4).astype(np.float32))
    b = ndl.Tensor(np.random.randn(1, 4).astype(np.float32))
    x = ndl.Tensor(np.random.randn(16, 8).astype(np.float32))
    with autocast("float16"):
        h = x @ w
        z = ndl.relu(h + b.broadcast_to(h.shape))
        loss = ndl.logsumexp(z, (1,)).sum()
    assert h.dtype == "float16" and z.dtype == "float16"   # products and activations: half
    assert loss.dtype == "float32"                          # reductions / softmax: float32
    assert switches.autocast_hook is None                    # the hook is removed on exit
    loss.backward()
    assert w.grad.dtype == "float32" and b.grad.dtype == "float32" and w.dtype == "float32"
    # gradient matches float64 math to half-precision accuracy
    xw = x.numpy().astype(np.float64) @ w.numpy() + b.numpy()
    zz = np.maximum(xw, 0)
    p = np.exp(zz - zz.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    gw = x.numpy().T @ (p * (xw > 0))
    np.testing.assert_allclose(w.grad.numpy(), gw, rtol=2e-2, atol=2e-2)


def test_autocast_decorator_casts_inside_and_restores_after():
    a = ndl.Tensor(np.ones((2, 2), np.float32))

    @autocast("bfloat16")
    def product(t):
        """Matmul under autocast."""
        return t @ t

    assert product(a).dtype == "bfloat16" and product.__name__ == "product"
    assert (a @ a).dtype == "float32"


def test_bad_autocast_dtype():
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        autocast("float64")


def _inject(opt, value):
    p = opt.params[0]
    g = p.grad.numpy()
    g.reshape(-1)[0] = value
    p.grad = ndl.Tensor(g)


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_scaler_skips_step_and_backs_off_on_overflow(bad):
    model = nn.Linear(4, 2)
    opt = ndl.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler()
    assert scaler.get_scale() == 2.0 ** 16
    x = ndl.Tensor(np.random.randn(3, 4).astype(np.float32))
    before = [p.numpy() for p in model.parameters()]
    scaler.scale(model(x).sum()).backward()
    _inject(opt, bad)
    with np.errstate(invalid="ignore"):                     # inf - inf inside the check
        assert scaler.step(opt) is False
    scaler.update()
    assert scaler.get_scale() == 2.0 ** 15
    for p, w in zip(model.parameters(), before):
        assert np.array_equal(p.numpy(), w)                 # skipped: weights untouched


def test_scaler_unscales_and_grows_after_interval():
    model = nn.Linear(4, 2)
    opt = ndl.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler(init_scale=8.0, growth_interval=3)
    x = ndl.Tensor(np.random.randn(3, 4).astype(np.float32))
    model(x).sum().backward()
    ref = model.weight.grad.numpy()
    for _ in range(3):
        opt.reset_grad()
        scaler.scale(model(x).sum()).backward()
        scaler.unscale_(opt)
        np.testing.assert_allclose(model.weight.grad.numpy(), ref, rtol=1e-6)
        assert scaler.step(opt) is True
        scaler.update()
    assert scaler.get_scale() == 16.0


def _model():
    np.random.seed(1)
    hidden = [m for _ in range(4) for m in (nn.Linear(64, 64), nn.ReLU())]
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), *hidden, nn.Linear(64, 4))


def _data():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1024, 16)).astype(np.float32)
    y = (x @ rng.standard_normal((16, 4))).argmax(1)
    return (ndl.Tensor(x, requires_grad=False),
            ndl.Tensor(y, dtype="int64", requires_grad=False))


def _train(dtype, steps):
    model, (x, y) = _model(), _data()
    opt = ndl.optim.Adam(model.parameters(), lr=3e-3)
    scaler = GradScaler(enabled=dtype is not None)
    lossf = nn.SoftmaxLoss()
    for _ in range(steps):
        opt.reset_grad()
        with autocast(dtype or "float16", enabled=dtype is not None):
            loss = lossf(model(x), y)
        scaler.scale(loss).backward(create_graph=False)
        scaler.step(opt)
        scaler.update()
    with MemoryTracker() as tr:
        with autocast(dtype or "float16", enabled=dtype is not None):
            loss = lossf(model(x), y)
        act = tr.current_bytes                               # what the graph keeps
    params = sum(p.realize_cached_data().nbytes for p in model.parameters())
    return float(loss.numpy()), params + act


@pytest.mark.slow
@pytest.mark.parametrize("dtype,steps", [("bfloat16", 10), ("float16", 4)])
def test_memory_and_final_loss_against_float32(dtype, steps):
    ref_loss, ref_bytes = _train(None, steps)
    loss, nbytes = _train(dtype, steps)
    assert nbytes <= 0.55 * ref_bytes, nbytes / ref_bytes
    assert abs(loss - ref_loss) <= 0.01 * ref_loss

"""needle.optim: update rules against NumPy references and torch, state, clipping, schedules."""
import gc
import math

import numpy as np
import pytest
from helpers import DEVICES

import needle as ndl
from needle import nn, optim

pytestmark = pytest.mark.hw2


def _model(device, seed=0):
    np.random.seed(seed)
    return nn.Sequential(nn.Linear(4, 5, device=device), nn.ReLU(), nn.Linear(5, 3, device=device))


def _data(device):
    rng = np.random.default_rng(7)
    x = ndl.Tensor(rng.standard_normal((8, 4)).astype("float32"), device=device)
    y = ndl.Tensor(rng.integers(0, 3, size=8), device=device, dtype="int64")
    return x, y


def _train(model, opt, device, steps, sched=None):
    x, y = _data(device)
    losses = []
    for _ in range(steps):
        opt.reset_grad()
        loss = nn.SoftmaxLoss()(model(x), y)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(float(loss.numpy()))
    return losses


def _grads_np(model, device):
    """Gradients of the loss at the current weights, as numpy arrays."""
    x, y = _data(device)
    for p in model.parameters():
        p.grad = None
    nn.SoftmaxLoss()(model(x), y).backward()
    return [p.grad.numpy().astype(np.float64) for p in model.parameters()]


@pytest.mark.parametrize("device", DEVICES)
def test_sgd_course_momentum_rule(device):
    """u = m u + (1 - m)(g + wd w), u0 = 0; w -= lr u (course hw2), checked step by step."""
    lr, mom, wd = 0.5, 0.9, 0.01
    model = _model(device)
    opt = optim.SGD(model.parameters(), lr=lr, momentum=mom, weight_decay=wd)
    u = [np.zeros(p.shape) for p in model.parameters()]
    for _ in range(4):
        w = [p.numpy().astype(np.float64) for p in model.parameters()]
        g = _grads_np(model, device)
        opt.step()
        for i, p in enumerate(model.parameters()):
            u[i] = mom * u[i] + (1 - mom) * (g[i] + wd * w[i])
            np.testing.assert_allclose(p.numpy(), w[i] - lr * u[i], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["device", "composed"])
def test_adam_rule_step_by_step(device, path, monkeypatch):
    """Adam's rule, on the device's multi-tensor step where it has one (numba on the CPU, a
    kernel on a GPU) and with it hidden (the composed step)."""
    lr, b1, b2, eps, wd = 0.01, 0.8, 0.9, 1e-8, 0.1
    model = _model(device)
    opt = optim.Adam(model.parameters(), lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd)
    if path == "composed":
        monkeypatch.setattr(model[0].weight.device, "multi_tensor_adam", None, raising=False)
    m = [np.zeros(p.shape) for p in model.parameters()]
    v = [np.zeros(p.shape) for p in model.parameters()]
    for t in range(1, 5):
        w = [p.numpy().astype(np.float64) for p in model.parameters()]
        g = _grads_np(model, device)
        opt.step()
        for i, p in enumerate(model.parameters()):
            gi = g[i] + wd * w[i]
            m[i] = b1 * m[i] + (1 - b1) * gi
            v[i] = b2 * v[i] + (1 - b2) * gi ** 2
            want = w[i] - lr * (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps)
            np.testing.assert_allclose(p.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw", "adamw-composed"])
def test_optimizers_match_torch(kind, device, monkeypatch):
    torch = pytest.importorskip("torch")
    model = _model(device)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    with torch.no_grad():
        for lin, i in ((ref[0], 0), (ref[2], 2)):
            lin.weight.copy_(torch.tensor(model[i].weight.numpy().T))
            lin.bias.copy_(torch.tensor(model[i].bias.numpy().reshape(-1)))
    if kind == "sgd":  # torch's first momentum step differs from the course's; compare plain SGD
        opt = optim.SGD(model.parameters(), lr=0.3, weight_decay=0.05)
        opt_t = torch.optim.SGD(ref.parameters(), lr=0.3, weight_decay=0.05)
    elif kind == "adam":
        opt = optim.Adam(model.parameters(), lr=0.05, weight_decay=0.02)
        opt_t = torch.optim.Adam(ref.parameters(), lr=0.05, weight_decay=0.02)
    else:
        opt = optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
        if kind == "adamw-composed":  # the device's multi-tensor step hidden
            monkeypatch.setattr(model[0].weight.device, "multi_tensor_adam", None,
                                raising=False)
        opt_t = torch.optim.AdamW(ref.parameters(), lr=0.05, weight_decay=0.1)
    losses = _train(model, opt, device, 6)
    x, y = _data(device)
    xt, yt = torch.tensor(x.numpy()), torch.tensor(y.numpy())
    ref_losses = []
    for _ in range(6):
        opt_t.zero_grad()
        loss = torch.nn.functional.cross_entropy(ref(xt), yt)
        loss.backward()
        opt_t.step()
        ref_losses.append(loss.item())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(model[0].weight.numpy(), ref[0].weight.detach().numpy().T,
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model[2].bias.numpy().reshape(-1), ref[2].bias.detach().numpy(),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [optim.SGD, optim.Adam, optim.AdamW])
def test_tied_weights_updated_once_and_frozen_skipped(cls, device):
    np.random.seed(0)
    a, b = nn.Linear(3, 3, device=device), nn.Linear(3, 3, device=device)
    b.weight = a.weight
    frozen = nn.Parameter(ndl.init.ones(3, device=device))
    params = a.parameters() + b.parameters() + [frozen]
    opt = cls(params, lr=0.1) if cls is not optim.SGD else cls(params, lr=0.1, momentum=0.5)
    assert len(opt.params) == 4  # a.weight, a.bias, b.bias, frozen
    # reference: the same update applied once, with the gradient summed over both uses
    ref_w = a.weight.numpy()
    x = ndl.Tensor(np.random.randn(2, 3), device=device)
    b(a(x)).sum().backward()
    g = a.weight.grad.numpy()
    opt.step()
    if cls is optim.SGD:
        want = ref_w - 0.1 * 0.5 * g
    else:  # first Adam step moves each entry by lr * g / (|g| + eps) (AdamW also decays)
        decay = 1 - 0.1 * 0.01 if cls is optim.AdamW else 1.0
        want = ref_w * decay - 0.1 * g / (np.abs(g) + 1e-8)
    np.testing.assert_allclose(a.weight.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(frozen.numpy(), np.ones(3))
    assert 3 not in opt.state  # no state for the parameter without a gradient


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [optim.SGD, optim.Adam])
def test_steps_do_not_grow_the_graph(cls, device):
    model = _model(device)
    opt = cls(model.parameters(), lr=0.01) if cls is optim.Adam else \
        cls(model.parameters(), lr=0.01, momentum=0.9, weight_decay=0.01)
    x, y = _data(device)
    counts = []
    for step in range(8):
        opt.reset_grad()
        loss = nn.SoftmaxLoss()(model(x), y)
        loss.backward()
        opt.step()
        del loss
        if step in (2, 7):
            gc.collect()  # cycles (if any) are freed by the collector, not by refcounting
            counts.append(ndl.autograd.TENSOR_COUNTER)
    assert counts[0] == counts[1], counts
    for p in model.parameters():
        assert p.is_leaf() and p.op is None and p.inputs == ()


@pytest.mark.parametrize("cls", [optim.SGD, optim.Adam, optim.AdamW])
def test_state_dict_resume_is_exact(cls):
    kw = {"lr": 0.05, "momentum": 0.9} if cls is optim.SGD else {"lr": 0.05}
    device = ndl.cpu()
    full = _model(device)
    full_opt = cls(full.parameters(), **kw)
    want = _train(full, full_opt, device, 6)
    first = _model(device)
    opt = cls(first.parameters(), **kw)
    got = _train(first, opt, device, 3)
    model_sd, opt_sd = first.state_dict(), opt.state_dict()
    assert all(isinstance(v, np.ndarray) for s in opt_sd["state"].values()
               for v in s.values() if not np.isscalar(v))
    resumed = _model(device, seed=99)
    resumed.load_state_dict(model_sd)
    opt2 = cls(resumed.parameters(), lr=123.0)
    opt2.load_state_dict(opt_sd)
    assert opt2.lr == 0.05
    got += _train(resumed, opt2, device, 3)
    assert got == want  # bit for bit
    with pytest.raises(ValueError, match="shape"):
        bad_state = {k: (np.zeros((1, 1)) if isinstance(v, np.ndarray) else v)
                     for k, v in opt_sd["state"]["0"].items()}
        bad = {"hyper": opt_sd["hyper"], "state": {"0": bad_state}}
        cls(resumed.parameters()).load_state_dict(bad)


@pytest.mark.parametrize("device", DEVICES)
def test_clip_grad_norm(device):
    model = _model(device)
    params = model.parameters()
    grads = _grads_np(model, device)
    total = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
    assert optim.grad_norm(params + params) == pytest.approx(total, rel=1e-5)  # dedup
    assert optim.clip_grad_norm(params, total * 10) == pytest.approx(total, rel=1e-5)
    for p, g in zip(params, grads):  # under the limit: unchanged
        np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-6)
    returned = optim.clip_grad_norm(params, 0.5 * total)
    assert returned == pytest.approx(total, rel=1e-5)
    assert optim.grad_norm(params) == pytest.approx(0.5 * total, rel=1e-4)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad.numpy(), g * 0.5, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="max_norm"):
        optim.clip_grad_norm(params, 0.0)


@pytest.mark.torch
def test_schedules_match_torch():
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.zeros(1))
    for make, make_t in (
            (lambda o: optim.StepLR(o, step_size=3, gamma=0.5),
             lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5)),
            (lambda o: optim.CosineAnnealing(o, T_max=7, eta_min=0.01),
             lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=7, eta_min=0.01))):
        opt = optim.SGD([nn.Parameter(ndl.init.zeros(1))], lr=0.2)
        opt_t = torch.optim.SGD([p], lr=0.2)
        sched, sched_t = make(opt), make_t(opt_t)
        for _ in range(7):
            assert opt.lr == pytest.approx(opt_t.param_groups[0]["lr"], rel=1e-9)
            sched.step()
            opt_t.step()
            sched_t.step()


def test_warmup_composes_with_cosine_and_resumes():
    opt = optim.Adam([nn.Parameter(ndl.init.zeros(1))], lr=1.0)
    sched = optim.LinearWarmup(opt, 4, after=optim.CosineAnnealing(opt, T_max=10))
    lrs = [opt.lr] + [sched.step() for _ in range(16)]
    want = [0.25, 0.5, 0.75, 1.0] + [(1 + math.cos(math.pi * min(s, 10) / 10)) / 2
                                     for s in range(13)]
    np.testing.assert_allclose(lrs, want, rtol=1e-12)
    opt2 = optim.Adam([nn.Parameter(ndl.init.zeros(1))], lr=1.0)
    sched2 = optim.LinearWarmup(opt2, 4, after=optim.CosineAnnealing(opt2, T_max=10))
    sched2.load_state_dict(sched.state_dict())
    assert opt2.lr == opt.lr and sched2.step() == sched.step()
    with pytest.raises(ValueError, match="warmup_steps"):
        optim.LinearWarmup(opt, 0)

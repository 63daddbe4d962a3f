"""Gradient accumulation: k micro-batches give the full batch's gradient and the same step."""
import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.memory import accumulate_gradients, split_batch


def _setup():
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    x = ndl.Tensor(np.random.randn(10, 6).astype(np.float32), requires_grad=False)
    y = ndl.Tensor(np.random.randint(0, 3, 10), dtype="int64", requires_grad=False)
    loss = nn.SoftmaxLoss()
    return model, x, y, (lambda a, b: loss(model(a), b))


@pytest.mark.parametrize("k", [1, 3, 4, 10])
def test_accumulated_gradient_equals_full_batch(k):
    model, x, y, loss_fn = _setup()
    full = loss_fn(x, y)
    full.backward()
    ref = [p.grad.numpy().astype(np.float64) for p in model.parameters()]
    mean = accumulate_gradients(loss_fn, split_batch([x, y], k), model.parameters())
    assert mean == pytest.approx(float(full.numpy()), abs=1e-6)
    for p, g in zip(model.parameters(), ref):
        np.testing.assert_allclose(p.grad.numpy(), g, atol=1e-6, rtol=1e-5)


def test_step_equals_full_batch_step():
    model, x, y, loss_fn = _setup()
    before = [p.numpy() for p in model.parameters()]
    opt = ndl.optim.SGD(model.parameters(), lr=0.5)
    loss_fn(x, y).backward()
    opt.step()
    full_step = [p.numpy() for p in model.parameters()]
    for p, w in zip(model.parameters(), before):
        p.data = ndl.Tensor(w)
    accumulate_gradients(loss_fn, split_batch([x, y], 5), model.parameters(), opt)
    for p, w in zip(model.parameters(), full_step):
        np.testing.assert_allclose(p.numpy(), w, atol=1e-6)


def test_bad_splits():
    _, x, y, _ = _setup()
    with pytest.raises(ValueError, match="cannot split a batch of 10 into 11"):
        split_batch([x, y], 11)
    with pytest.raises(ValueError, match="positive int"):
        split_batch([x, y], 0)
    with pytest.raises(ValueError, match="differ in length"):
        split_batch([x, ndl.Tensor(np.zeros(3))], 2)

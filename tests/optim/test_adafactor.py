"""Adafactor: matches a NumPy transcription of the paper, with O(n + m) state per matrix."""
import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.memory import MemoryTracker, bytes_of


def _reference(w, grads):
    """Shazeer & Stern 2018, Alg. 4 (matrix) in float64 NumPy, paper defaults."""
    r = np.zeros((w.shape[0], 1))
    c = np.zeros((1, w.shape[1]))
    w = w.astype(np.float64)
    for t, g in enumerate(grads, start=1):
        b2 = 1 - t ** -0.8
        g2 = g * g + 1e-30
        r = b2 * r + (1 - b2) * g2.sum(1, keepdims=True)
        c = b2 * c + (1 - b2) * g2.sum(0, keepdims=True)
        v = r @ c / r.sum()
        u = g / np.sqrt(v)
        u /= max(1.0, np.sqrt((u ** 2).mean()))
        alpha = max(1e-3, np.sqrt((w ** 2).mean())) * min(1e-2, 1 / np.sqrt(t))
        w = w - alpha * u
    return w


def test_matches_paper_transcription():
    w0 = np.random.randn(6, 5)
    grads = [np.random.randn(6, 5) for _ in range(4)]
    p = ndl.Tensor(w0, dtype="float64")
    opt = ndl.optim.Adafactor([p])
    for g in grads:
        p.grad = ndl.Tensor(g, dtype="float64")
        opt.step()
    np.testing.assert_allclose(p.numpy(), _reference(w0, grads), rtol=1e-10, atol=1e-12)


def test_state_is_rows_plus_cols_and_smaller_than_adam():
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    x = ndl.Tensor(np.random.randn(16, 64).astype(np.float32), requires_grad=False)
    sizes = {}
    for name, make in (("adam", ndl.optim.Adam), ("adafactor", ndl.optim.Adafactor)):
        opt = make(model.parameters())
        opt.reset_grad()
        (model(x) ** 2).sum().backward()
        with MemoryTracker():
            opt.step()
        sizes[name] = bytes_of([v for s in opt.state.values() for v in s.values()
                                if not isinstance(v, int)])
    n_params = 64 * 128 + 128 + 128 * 32 + 32
    assert sizes["adam"] == 8 * n_params
    # factored: rows + cols per matrix, full state for the (1, m) bias rows
    expected = 4 * ((64 + 128) + (1 + 128) + (128 + 32) + (1 + 32))
    assert sizes["adafactor"] == expected
    assert sizes["adafactor"] < 0.05 * sizes["adam"]


def test_trains_a_small_regression():
    np.random.seed(0)
    model = nn.Linear(8, 1)
    x = np.random.randn(64, 8).astype(np.float32)
    y = x @ np.random.randn(8, 1).astype(np.float32)
    xt, yt = ndl.Tensor(x, requires_grad=False), ndl.Tensor(y, requires_grad=False)
    opt = ndl.optim.Adafactor(model.parameters(), lr=0.05, scale_parameter=False)
    losses = []
    for _ in range(60):
        opt.reset_grad()
        loss = ((model(xt) - yt) ** 2).sum() / 64
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    assert losses[-1] < 0.1 * losses[0]


def test_bad_lr():
    with pytest.raises(ValueError, match=r"Adafactor: lr -1.0 must be a finite number >= 0"):
        ndl.optim.Adafactor([ndl.Tensor([1.0])], lr=-1.0)


def test_a_fixed_step_without_an_lr_is_named():
    w = ndl.Tensor(np.ones((3, 2), np.float32), requires_grad=True)
    (w * w).sum().backward()
    opt = ndl.optim.Adafactor([w], lr=None, relative_step=False)
    with pytest.raises(ValueError, match="relative_step=False needs an lr"):
        opt.step()

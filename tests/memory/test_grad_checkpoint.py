"""checkpoint / checkpoint_sequential: bitwise-equal gradients, less memory, clear errors."""
import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.memory import (
    MemoryTracker,
    NondeterministicCheckpoint,
    checkpoint,
    checkpoint_sequential,
    segment_bounds,
)


def _mlp(depth, width, dropout=0.0):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def _grads(model, run, x):
    for p in model.parameters():
        p.grad = None
    xt = ndl.Tensor(x, requires_grad=True)
    loss = (run(xt) ** 2).sum()
    loss.backward()
    return [p.grad.numpy() for p in model.parameters()] + [xt.grad.numpy()], loss.numpy()


@pytest.mark.parametrize("segments", [None, 1, 2, 3, 8])
def test_sequential_gradients_are_bitwise_equal(segments):
    model = _mlp(4, 12)
    x = np.random.randn(6, 12).astype(np.float32)
    plain, loss_p = _grads(model, model, x)
    ck, loss_c = _grads(model, lambda t: checkpoint_sequential(model, segments, t), x)
    assert np.array_equal(loss_p, loss_c)
    for a, b in zip(plain, ck):
        assert np.array_equal(a, b)


def test_dropout_is_replayed_in_recompute():
    model = _mlp(3, 10, dropout=0.5)
    x = np.random.randn(5, 10).astype(np.float32)
    np.random.seed(7)
    plain, _ = _grads(model, model, x)
    np.random.seed(7)
    ck, _ = _grads(model, lambda t: checkpoint_sequential(model, 3, t), x)
    for a, b in zip(plain, ck):
        assert np.array_equal(a, b)


def test_checkpoint_function_with_params_matches_numerical_gradient():
    w = ndl.Tensor(np.random.randn(3, 3), dtype="float64")
    x = ndl.Tensor(np.random.randn(2, 3), dtype="float64")
    y = checkpoint(lambda t: ndl.tanh(t @ w), x, params=[w])
    y.sum().backward()
    eps = 1e-6
    wn = w.numpy()
    num = np.zeros_like(wn)
    for i in np.ndindex(wn.shape):
        d = np.zeros_like(wn)
        d[i] = eps
        xn = x.numpy()
        num[i] = (np.tanh(xn @ (wn + d)).sum() - np.tanh(xn @ (wn - d)).sum()) / 2 / eps
    np.testing.assert_allclose(w.grad.numpy(), num, rtol=1e-6, atol=1e-8)
    assert w.grad is not None and x.grad is not None


def test_recompute_keeps_less_memory_than_plain():
    model = _mlp(16, 32)
    x = ndl.Tensor(np.random.randn(256, 32).astype(np.float32), requires_grad=False)
    peaks = []
    for run in (model, lambda t: checkpoint_sequential(model, None, t)):
        for p in model.parameters():
            p.grad = None
        with MemoryTracker() as tr:
            loss = run(x).sum()
            loss.backward(create_graph=False)
            tr.classify(parameters=model.parameters())
        peaks.append(tr.peak_excluding("gradients"))
        del loss
    assert peaks[1] < 0.5 * peaks[0]


def test_nondeterministic_function_is_detected():
    w = ndl.Tensor(np.random.randn(4, 4).astype(np.float32))
    counter = {"calls": 0}

    def drifting(t):
        counter["calls"] += 1
        return t @ w + float(counter["calls"])          # different on the recompute

    x = ndl.Tensor(np.random.randn(2, 4).astype(np.float32))
    y = checkpoint(drifting, x, params=[w])
    with pytest.raises(NondeterministicCheckpoint, match="not deterministic"):
        y.sum().backward()


def test_undeclared_parameter_is_an_error():
    w = ndl.Tensor(np.random.randn(4, 4).astype(np.float32))
    x = ndl.Tensor(np.random.randn(2, 4).astype(np.float32))
    y = checkpoint(lambda t: t @ w, x, params=[])
    with pytest.raises(ValueError, match="neither an input nor a parameter"):
        y.sum().backward()


def test_segments_larger_than_chain_and_bad_values():
    model = _mlp(2, 4)
    x = ndl.Tensor(np.random.randn(2, 4).astype(np.float32))
    with pytest.raises(ValueError, match="larger than the chain"):
        checkpoint_sequential(model, 5, x)
    with pytest.raises(ValueError, match="positive int"):
        segment_bounds(4, 0)
    assert segment_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]


def test_non_tensor_output_is_a_type_error():
    x = ndl.Tensor(np.random.randn(2, 4).astype(np.float32))
    with pytest.raises(TypeError, match="single Tensor"):
        checkpoint(lambda t: (t, t), x)

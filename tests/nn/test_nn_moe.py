"""nn.MoE: top-k gating against a per-token numpy reference, capacity drops, the Switch
load-balancing loss, and central-difference gradients in float64."""
import numpy as np
import pytest
from nn_helpers import module_gradcheck

import needle as ndl
from needle import nn


def numpy_moe(moe, x, capacity=None):
    """Loop over tokens: softmax router, top-k, (renormalized) gates, experts in numpy."""
    w_r = moe.router.weight.numpy()
    z = x @ w_r
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    out = np.zeros_like(x)
    fill = np.zeros(moe.num_experts, dtype=int)
    picks = [np.argsort(-p[t])[:moe.top_k] for t in range(len(x))]
    for j in range(moe.top_k):
        for t in range(len(x)):
            e = picks[t][j]
            if capacity is not None and fill[e] >= capacity:
                continue
            fill[e] += 1
            g = p[t, e] / p[t, picks[t]].sum() if moe.top_k > 1 else p[t, e]
            ex = moe.experts[e]
            h = np.maximum(x[t] @ ex.linear1.weight.numpy() + ex.linear1.bias.numpy()[0], 0)
            out[t] += g * (h @ ex.linear2.weight.numpy() + ex.linear2.bias.numpy()[0])
    f = np.bincount([pk[0] for pk in picks], minlength=moe.num_experts) / len(x)
    aux = moe.num_experts * np.sum(f * p.mean(0))
    return out, aux


@pytest.mark.parametrize("top_k", [1, 2])
def test_matches_numpy_reference(top_k):
    np.random.seed(0)
    moe = nn.MoE(6, 10, 4, top_k=top_k, capacity_factor=1.0, dtype="float64")
    x = np.random.RandomState(1).randn(3, 5, 6)                     # (B, T, d)
    out = moe(ndl.Tensor(x, dtype="float64"))
    flat = x.reshape(15, 6)
    want, aux = numpy_moe(moe, flat, capacity=moe.capacity(15))
    np.testing.assert_allclose(out.numpy().reshape(15, 6), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(float(moe.aux_loss.numpy()), aux, rtol=1e-12)
    assert moe.tokens_per_expert.sum() + moe.dropped == 15 * top_k


def test_capacity_drops_are_counted_and_zero():
    np.random.seed(0)
    moe = nn.MoE(4, 8, 4, top_k=1, capacity_factor=1.0, dtype="float64")
    w = np.zeros((4, 4))
    w[:, 0] = 5.0                                                     # expert 0 wins always
    moe.router.weight.cached_data = ndl.NDArray(w, dtype="float64")
    x = np.abs(np.random.RandomState(2).randn(8, 4)) + 0.1            # positive: logit 0 big
    out = moe(ndl.Tensor(x, dtype="float64")).numpy()
    cap = moe.capacity(8)                                             # ceil(8 / 4) = 2
    assert cap == 2 and moe.dropped == 8 - cap
    assert list(moe.tokens_per_expert) == [2, 0, 0, 0]
    assert np.all(out[cap:] == 0) and np.all(np.abs(out[:cap]).sum(1) > 0)
    # all tokens pick expert 0 (dropped or not): f = (1, 0, 0, 0), so aux = E * P_0
    p0 = numpy_moe(moe, x)[1] / 4
    np.testing.assert_allclose(float(moe.aux_loss.numpy()), 4 * p0, rtol=1e-12)


def test_idle_expert_gets_no_gradient_and_others_do():
    np.random.seed(0)
    moe = nn.MoE(4, 8, 3, top_k=1, capacity_factor=4.0, dtype="float64")
    w = np.random.RandomState(3).randn(4, 3)
    w[:, 2] = -50.0                                                   # expert 2 never chosen
    moe.router.weight.cached_data = ndl.NDArray(w, dtype="float64")
    x = ndl.Tensor(np.abs(np.random.RandomState(4).randn(6, 4)), dtype="float64")
    (moe(x) ** 2).sum().backward()
    assert moe.tokens_per_expert[2] == 0
    assert moe.experts[2].linear1.weight.grad is None
    for e in (0, 1):
        assert (moe.experts[e].linear1.weight.grad is not None) == (moe.tokens_per_expert[e] > 0)


@pytest.mark.parametrize("top_k", [1, 2])
def test_gradients_central_differences(top_k):
    np.random.seed(1)
    moe = nn.MoE(3, 4, 3, top_k=top_k, capacity_factor=3.0, dtype="float64")
    x = np.random.RandomState(5).randn(5, 3)

    def fn(t):
        return [moe(t), moe.aux_loss]
    module_gradcheck(fn, moe, [x], device=ndl.cpu())


def test_bad_input():
    with pytest.raises(ValueError, match="top_k"):
        nn.MoE(4, 8, 4, top_k=3)
    with pytest.raises(ValueError, match="d_model=4"):
        nn.MoE(4, 8, 4)(ndl.Tensor(np.zeros((2, 5)), dtype="float32"))
    for factor in (0, -1.0, float("nan")):  # 0 slots: every token dropped, an all-zero output
        with pytest.raises(ValueError, match=f"capacity_factor must be > 0, got {factor}"):
            nn.MoE(4, 8, 4, capacity_factor=factor)

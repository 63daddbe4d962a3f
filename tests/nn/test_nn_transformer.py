"""Attention and Transformer: against a torch re-implementation and float64 central differences."""
import numpy as np
import pytest
from helpers import DEVICES
from nn_helpers import assert_close, module_gradcheck

import needle as ndl
from needle import nn

pytestmark = pytest.mark.hw4


def _tiny_transformer(device, dtype="float32", causal=True, batch_first=False):
    return nn.Transformer(4, 6, 2, num_head=2, dim_head=3, causal=causal, device=device,
                          dtype=dtype, batch_first=batch_first, sequence_len=5)


@pytest.mark.parametrize("device", DEVICES)
def test_transformer_layer_gradcheck(device):
    np.random.seed(0)
    layer = nn.TransformerLayer(4, 2, 2, 3, causal=True, device=device, dtype="float64")
    module_gradcheck(layer, layer, [np.random.randn(2, 3, 4)], device)


@pytest.mark.parametrize("device", DEVICES)
def test_cross_attention_gradcheck(device):
    np.random.seed(1)
    att = nn.AttentionLayer(3, 2, 2, k_features=2, v_features=4, out_features=3, causal=False,
                            device=device, dtype="float64")
    module_gradcheck(att, att, [np.random.randn(1, 2, 3), np.random.randn(1, 4, 2),
                                np.random.randn(1, 4, 4)], device)


@pytest.mark.parametrize("device", DEVICES)
def test_causal_mask_blocks_the_future(device):
    np.random.seed(2)
    model = _tiny_transformer(device, batch_first=True)
    x = np.random.randn(2, 5, 4).astype("float32")
    out, zeros = model(ndl.Tensor(x, device=device))
    assert out.shape == (2, 5, 4) and not zeros.numpy().any()
    x2 = x.copy()
    x2[:, 3:] += 10.0  # change only positions 3 and 4
    out2, _ = model(ndl.Tensor(x2, device=device))
    np.testing.assert_allclose(out2.numpy()[:, :3], out.numpy()[:, :3], rtol=1e-5, atol=1e-5)
    assert not np.allclose(out2.numpy()[:, 3:], out.numpy()[:, 3:])
    with pytest.raises(ValueError, match="sequence_len"):
        model(ndl.Tensor(np.zeros((1, 6, 4)), device=device))


def _torch_layer(torch, layer, x):
    """A torch re-implementation of one needle TransformerLayer (pre-norm, as the course)."""
    F = torch.nn.functional

    def T(p):
        return torch.tensor(p.numpy(), requires_grad=True)

    att = layer.attn
    b, t, f = x.shape
    leaves = {}

    def ln(z, m, name):
        w, bias = leaves.setdefault(name + ".weight", T(m.weight)), \
            leaves.setdefault(name + ".bias", T(m.bias))
        return F.layer_norm(z, (z.shape[-1],), w, bias, eps=m.eps)

    def heads(z, norm, proj, name):
        W = leaves.setdefault(name, T(proj.weight))
        y = ln(z, norm, name + ".norm") @ W
        return y.reshape(b, t, att.num_head, att.dim_head).transpose(1, 2)

    qh = heads(x, att.prenorm_q, att.q_projection, "q")
    kh = heads(x, att.prenorm_k, att.k_projection, "k")
    vh = heads(x, att.prenorm_v, att.v_projection, "v")
    a = F.scaled_dot_product_attention(qh, kh, vh, is_causal=att.attn.causal)
    a = a.transpose(1, 2).reshape(b, t, -1) @ leaves.setdefault("o", T(att.out_projection.weight))
    x = x + a
    h = ln(x, layer.layernorm1, "ln1")
    W1, b1 = leaves.setdefault("w1", T(layer.linear1.weight)), leaves.setdefault(
        "b1", T(layer.linear1.bias))
    W2, b2 = leaves.setdefault("w2", T(layer.linear2.weight)), leaves.setdefault(
        "b2", T(layer.linear2.bias))
    return x + (torch.relu(h @ W1 + b1) @ W2 + b2), leaves


@pytest.mark.torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
def test_transformer_matches_torch(causal, device):
    torch = pytest.importorskip("torch")
    np.random.seed(3)
    model = _tiny_transformer(device, causal=causal)
    x = np.random.randn(5, 2, 4).astype("float32")  # (T, B, D): batch_first=False
    xt = ndl.Tensor(x, device=device)
    out, _ = model(xt)
    w = np.random.randn(*out.shape).astype("float32")
    (out * ndl.Tensor(w, device=device)).sum().backward()

    xr = torch.tensor(x, requires_grad=True)
    pos = torch.tensor(model.pos_embedding.weight.numpy(), requires_grad=True)
    h = xr.transpose(0, 1) + pos[:5].unsqueeze(0)
    layer_leaves = []
    for layer in model.layers:
        h, leaves = _torch_layer(torch, layer, h)
        layer_leaves.append(leaves)
    outr = h.transpose(0, 1)
    (outr * torch.tensor(w)).sum().backward()
    assert_close(out, outr)
    assert_close(xt.grad, xr.grad)
    assert_close(model.pos_embedding.weight.grad, pos.grad)
    first, last = model.layers[0], model.layers[1]
    assert_close(first.attn.q_projection.weight.grad, layer_leaves[0]["q"].grad)
    assert_close(first.attn.prenorm_v.weight.grad, layer_leaves[0]["v.norm.weight"].grad)
    assert_close(last.linear1.bias.grad, layer_leaves[1]["b1"].grad)
    assert_close(last.attn.out_projection.weight.grad, layer_leaves[1]["o"].grad)


@pytest.mark.parametrize("device", DEVICES)
def test_multihead_attention_probs_and_dropout(device):
    np.random.seed(4)
    q, k, v = (ndl.Tensor(np.random.randn(2, 3, 4, 5), device=device) for _ in range(3))
    mha = nn.MultiHeadAttention(causal=True, device=device)
    out, probs = mha(q, k, v)
    p = probs.numpy()
    assert out.shape == (2, 3, 4, 5) and p.shape == (2, 3, 4, 4)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)
    assert np.all(p[..., np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0)
    np.testing.assert_allclose(out.numpy(), p @ v.numpy(), rtol=1e-5, atol=1e-6)
    drop = nn.MultiHeadAttention(dropout=0.5, device=device)
    _, dp = drop(q, k, v)
    assert (dp.numpy() == 0).mean() > 0.3
    drop.eval()
    _, ep = drop(q, k, v)
    np.testing.assert_allclose(ep.numpy().sum(-1), 1.0, rtol=1e-5)

"""LoRA / QLoRA: frozen bases get no gradient or state, merge/unmerge, NF4 storage and error."""
import numpy as np
import pytest

import needle as ndl
from needle import nn

# Dettmers et al. 2023 (bitsandbytes' published NF4 table), typed in from the paper's appendix
NF4_PUBLISHED = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                          -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                          0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                          0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                          0.7229568362236023, 1.0])


def _model():
    np.random.seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def test_lora_starts_as_base_and_freezes_base():
    model = _model()
    x = ndl.Tensor(np.random.randn(4, 16).astype(np.float32), requires_grad=False)
    before = model(x).numpy()
    base_w = [model.modules[0].weight, model.modules[2].weight]
    nn.apply_lora(model, r=4, alpha=8)
    assert isinstance(model.modules[0], nn.LoRALinear)
    np.testing.assert_array_equal(model(x).numpy(), before)          # B = 0 at init
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {id(p) for p in trainable} == {id(p) for p in nn.lora_parameters(model)}
    opt = ndl.optim.Adam(model.parameters(), lr=0.01)
    (model(x) ** 2).sum().backward()
    opt.step()
    assert all(w.grad is None for w in base_w)
    assert len(opt.state) == 4                                        # A, B of two layers only


def test_lora_gradient_matches_formula_and_merge_roundtrip():
    model = _model()
    nn.apply_lora(model, r=2, alpha=4, target_modules=["0"])
    lo = model.modules[0]
    assert isinstance(model.modules[2], nn.Linear)                     # not targeted
    lo.lora_B.data = ndl.Tensor(np.random.randn(2, 32).astype(np.float32))
    x = np.random.randn(5, 16).astype(np.float32)
    xt = ndl.Tensor(x, requires_grad=False)
    out = lo(xt)
    a, b, w = lo.lora_A.numpy(), lo.lora_B.numpy(), lo.base.weight.numpy()
    bias = lo.base.bias.numpy()
    np.testing.assert_allclose(out.numpy(), x @ w + bias + 2.0 * (x @ a) @ b, rtol=1e-5,
                               atol=1e-5)
    out.sum().backward()
    g = np.ones((5, 32))
    np.testing.assert_allclose(lo.lora_B.grad.numpy(), 2.0 * (x @ a).T @ g, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(lo.lora_A.grad.numpy(), 2.0 * x.T @ (g @ b.T), rtol=1e-5,
                               atol=1e-4)
    lo.merge()
    np.testing.assert_allclose(lo(xt).numpy(), out.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lo.base.weight.numpy(), w + 2.0 * a @ b, rtol=1e-5, atol=1e-6)
    lo.unmerge()
    np.testing.assert_allclose(lo.base.weight.numpy(), w, atol=1e-6)


def test_bad_lora_arguments():
    with pytest.raises(ValueError, match="rank r"):
        nn.LoRALinear(nn.Linear(4, 4), r=5)
    with pytest.raises(ValueError, match="no nn.Linear matched"):
        nn.apply_lora(_model(), target_modules=["q_proj"])
    with pytest.raises(TypeError, match="wraps an nn.Linear"):
        nn.LoRALinear(nn.ReLU())


def test_nf4_codebook_matches_paper():
    np.testing.assert_allclose(nn.nf4_codebook(), NF4_PUBLISHED, atol=1e-6)


@pytest.mark.parametrize("double_quant,bpp", [(False, 0.5 + 4 / 64),
                                              (True, 0.5 + 1 / 64 + 4 / (64 * 256))])
def test_nf4_bytes_and_error(double_quant, bpp):
    w = (np.random.randn(128, 256) * 0.02).astype(np.float32)
    q = nn.quantize_nf4(ndl.Tensor(w), double_quant=double_quant)
    assert q.bytes_per_param() == pytest.approx(bpp, abs=2e-4)   # + one float32 mean
    d = q.dequantize()
    rel_rms = np.sqrt(((d - w) ** 2).mean()) / w.std()
    assert rel_rms < 0.12                          # 4 bits on normal weights: ~9% RMS error
    # every entry is the nearest NF4 level of its block (no double quant: exact scales)
    if not double_quant:
        blocks = w.reshape(-1, 64)
        scale = np.abs(blocks).max(1, keepdims=True)
        nearest = NF4_PUBLISHED[np.abs(blocks[..., None] / scale[..., None]
                                       - NF4_PUBLISHED).argmin(-1)] * scale
        np.testing.assert_allclose(d.reshape(-1, 64), nearest, atol=1e-6)


def test_qlora_forward_backward_use_dequantized_weight():
    model = _model()
    w = model.modules[0].weight.numpy()
    nn.apply_qlora(model, r=4, alpha=8, target_modules=["0"])
    ql = model.modules[0]
    wq = ql.qweight.dequantize()
    x = ndl.Tensor(np.random.randn(3, 16).astype(np.float32))
    out = ql(x)
    np.testing.assert_allclose(out.numpy(), x.numpy() @ wq + ql.bias.numpy(), rtol=1e-5,
                               atol=1e-5)
    assert np.abs(wq - w).max() < 0.2 * np.abs(w).max()
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.ones((3, 32)) @ wq.T, rtol=1e-5, atol=1e-5)
    assert ql.lora_B.grad is not None and ql.bias.grad is None


def test_qlora_finetune_close_to_full_finetune():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 32)).astype(np.float32)
    delta = (rng.standard_normal((32, 2)) @ rng.standard_normal((2, 16)) * 0.3)
    losses = {}
    for mode in ("full", "qlora"):
        np.random.seed(0)
        model = nn.Sequential(nn.Linear(32, 16))
        target = x @ (model.modules[0].weight.numpy() + delta) + model.modules[0].bias.numpy()
        if mode == "qlora":
            nn.apply_qlora(model, r=4, alpha=4)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = ndl.optim.Adam(params, lr=0.02)
        xt, yt = ndl.Tensor(x, requires_grad=False), ndl.Tensor(target, requires_grad=False)
        first = None
        for _ in range(60):
            opt.reset_grad()
            loss = ((model(xt) - yt) ** 2).sum() / 128
            loss.backward()
            opt.step()
            first = first if first is not None else float(loss.numpy())
        losses[mode] = (first, float(loss.numpy()))
    assert losses["qlora"][1] < 0.2 * losses["qlora"][0]
    assert losses["qlora"][1] < losses["full"][1] + 0.05 * losses["full"][0]

"""The memory estimator: published formulas, checked against MemoryTracker on needle models."""
import subprocess
import sys

import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.memory import MemoryTracker
from needle.memory.estimator import (
    TransformerConfig,
    estimate_module,
    estimate_transformer,
    transformer_num_params,
)

CFG = TransformerConfig(layers=4, hidden=256, heads=8, seq=128, vocab=1000, batch=2)


def test_parameter_count_formula():
    L, h, V, s = CFG.layers, CFG.hidden, CFG.vocab, CFG.seq
    assert transformer_num_params(CFG) == 12 * L * h * h + 13 * L * h + V * h + s * h


def test_korthikanti_activation_formulas():
    L, h, a, s, b = CFG.layers, CFG.hidden, CFG.heads, CFG.seq, CFG.batch
    est = estimate_transformer(CFG, precision="mixed")
    assert est["activations"] == pytest.approx(L * s * b * h * (34 + 5 * a * s / h))
    for t in (2, 4):
        est = estimate_transformer(CFG, precision="mixed", tp=t)
        assert est["activations"] == pytest.approx(
            L * s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
        est = estimate_transformer(CFG, precision="mixed", tp=t, sequence_parallel=True)
        assert est["activations"] == pytest.approx(L * s * b * h * (34 + 5 * a * s / h) / t)
    est = estimate_transformer(CFG, precision="mixed", checkpointing=True)
    assert est["activations"] == pytest.approx(L * 2 * s * b * h)


@pytest.mark.parametrize("stage,expected", [(0, lambda p, n: 16 * p),
                                            (1, lambda p, n: 4 * p + 12 * p / n),
                                            (2, lambda p, n: 2 * p + 14 * p / n),
                                            (3, lambda p, n: 16 * p / n)])
def test_zero_model_states_mixed_adam(stage, expected):
    psi = transformer_num_params(CFG)
    est = estimate_transformer(CFG, precision="mixed", optimizer="adam", zero_stage=stage, dp=8)
    assert est.model_states == pytest.approx(expected(psi, 8))


def test_fp32_sgd_adam_adafactor_states():
    psi = transformer_num_params(CFG)
    assert estimate_transformer(CFG, optimizer="adam").model_states == pytest.approx(16 * psi)
    assert estimate_transformer(CFG, optimizer="momentum").model_states == pytest.approx(12 * psi)
    ada = estimate_transformer(CFG, optimizer="adafactor")["optimizer_state"]
    assert ada < 0.05 * 4 * psi


@pytest.mark.parametrize("kwargs,msg", [
    (dict(cfg=TransformerConfig(2, 100, 12, 8, 10, 1)), "not divisible by heads"),
    (dict(tp=3), "does not divide heads"),
    (dict(pp=3), "does not divide layers"),
    (dict(zero_stage=4), "ZeRO stage"),
    (dict(dp=0), "positive int"),
    (dict(optimizer="lamb"), "unknown optimizer"),
    (dict(cfg=TransformerConfig(2, 64, 8, -1, 10, 1)), "seq must be a positive int"),
])
def test_impossible_configs_are_clear_errors(kwargs, msg):
    cfg = kwargs.pop("cfg", CFG)
    with pytest.raises(ValueError, match=msg):
        estimate_transformer(cfg, **kwargs)


def test_cli_prints_terms_and_rejects_bad_configs():
    ok = subprocess.run([sys.executable, "-m", "needle.estimate", "--layers", "2", "--hidden",
                         "64", "--heads", "4", "--seq", "16", "--vocab", "100", "--batch", "2",
                         "--precision", "mixed", "--zero", "2", "--dp", "4"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    for term in ("parameters", "gradients", "optimizer_state", "activations", "34 + 5 a s / h"):
        assert term in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "needle.estimate", "--hidden", "100",
                          "--heads", "12"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "not divisible by heads" in bad.stderr


class _TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Transformer(32, 64, 2, num_head=4, dim_head=8, causal=True,
                                   sequence_len=16)
        self.head = nn.Linear(16 * 32, 10)

    def forward(self, x):
        out, _ = self.body(x)                            # the course Transformer: (out, state)
        return self.head(out.reshape((x.shape[0], -1)))


def _train_step(model, opt, x, y):
    opt.reset_grad()
    loss = nn.SoftmaxLoss()(model(x), y)
    loss.backward(create_graph=False)
    opt.step()
    return loss


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_estimate_module_against_tracker(kind):
    np.random.seed(0)
    with MemoryTracker() as tr:
        if kind == "mlp":
            model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                                  nn.Linear(128, 10))
            x = ndl.Tensor(np.random.randn(256, 64).astype(np.float32), requires_grad=False)
            head = model
        else:
            model = _TinyTransformer()
            x = ndl.Tensor(np.random.randn(8, 16, 32).astype(np.float32), requires_grad=False)
            head = model
        y = ndl.Tensor(np.random.randint(0, 10, x.shape[0]), dtype="int64",
                       requires_grad=False)
        opt = ndl.optim.Adam(model.parameters(), lr=1e-3)
        _train_step(head, opt, x, y)
        tr.classify(parameters=model.parameters(), optimizer=opt)
        states = tr.current_by_category()
        measured_states = states["parameters"] + states["gradients"] + states["optimizer_state"]
        tr.reset_peak()
        _train_step(head, opt, x, y)
        measured_peak = tr.peak_bytes
    est = estimate_module(model, [x], loss_fn=lambda out: nn.SoftmaxLoss()(out, y),
                          optimizer="adam")
    assert abs(est.model_states - measured_states) <= 0.05 * measured_states
    assert abs(est.total - measured_peak) <= 0.20 * measured_peak, (est.report(), measured_peak)

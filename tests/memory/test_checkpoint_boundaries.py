"""Choosing checkpoint segments: exact against brute force, and the choice runs with equal
gradients."""
import itertools
from typing import Optional, Sequence, Tuple

import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.memory import (
    checkpoint_sequential,
    choose_checkpoints,
    evaluate_segments,
    profile_chain,
)


def brute_force(act: Sequence[float], budget: float, out: Optional[Sequence[float]] = None,
                cost: Optional[Sequence[float]] = None) -> Optional[Tuple[float, float]]:
    """(recompute, peak) of the best segments by enumerating all of them (tiny chains only)."""
    act = [float(v) for v in act]
    n = len(act)
    out = list(act) if out is None else [float(v) for v in out]
    cost = [1.0] * n if cost is None else [float(v) for v in cost]
    best = None
    for t in range(n + 1):
        for cuts in itertools.product((0, 1), repeat=max(t - 1, 0)):
            starts = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] if t else []
            segments = list(zip(starts, starts[1:] + [t])) if t else []
            peak, rec, _ = evaluate_segments(segments, t, act, out, cost)
            if peak <= budget and (best is None or (rec, peak) < best):
                best = (rec, peak)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_choice_matches_brute_force_on_small_chains(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 8))
    act = rng.integers(1, 20, n).astype(float)
    out = np.minimum(act, rng.integers(1, 10, n)).astype(float)
    cost = rng.uniform(0.5, 2.0, n)
    lo = brute_force(act, 1e9, out, cost)
    for frac in (0.35, 0.5, 0.7, 1.0):
        budget = frac * act.sum()
        ref = brute_force(act, budget, out, cost)
        if ref is None:
            with pytest.raises(ValueError, match="no choice of checkpoints fits"):
                choose_checkpoints(act, budget, out, cost)
            continue
        choice = choose_checkpoints(act, budget, out, cost)
        assert choice.peak <= budget + 1e-9
        assert choice.recompute == pytest.approx(ref[0])
        assert choice.peak == pytest.approx(ref[1])
        assert (choice.peak, choice.recompute) == pytest.approx(
            evaluate_segments(choice.segments, choice.plain_from, act, out, cost)[:2])
    assert lo == (0.0, act.sum())


def test_uniform_chain_gives_about_sqrt_n_segments():
    n = 64
    choice = choose_checkpoints([2.0] * n, budget=2 * 2 * np.sqrt(n) + 8, out=[1.0] * n)
    sizes = [e - s for s, e in choice.segments]
    assert 4 <= len(choice.segments) <= 16 and max(sizes) <= 16
    assert choice.peak <= 2 * 2 * np.sqrt(n) + 8 < 0.35 * 2 * n


def test_choice_executes_with_equal_gradients():
    model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(8, 8), nn.ReLU())])
    x = ndl.Tensor(np.random.randn(16, 8).astype(np.float32), requires_grad=False)
    act, out, cost = profile_chain(model.modules, x)
    assert act[0] == 2 * 16 * 8 * 4 and act[1] == 16 * 8 * 4   # Linear: matmul + add; ReLU
    choice = choose_checkpoints(act, budget=0.5 * sum(act), out=out, cost=cost)
    grads = []
    for run in (model, lambda t: checkpoint_sequential(
            model, x=t, boundaries=choice.boundaries, checkpoint_last=choice.checkpoint_last)):
        for p in model.parameters():
            p.grad = None
        run(x).sum().backward()
        grads.append([p.grad.numpy() for p in model.parameters()])
    for a, b in zip(*grads):
        assert np.array_equal(a, b)

"""The CPU ``adam_update`` primitive (adam_cpu.py) against the composed Adam/AdamW step."""
import numpy as np
import pytest

import needle as ndl
from needle.backend_ndarray import adam_cpu
from needle.backend_ndarray import fused_ops as F
from needle.backend_ndarray.ndarray import NDArray

pytestmark = pytest.mark.skipif(not adam_cpu.AVAILABLE, reason="numba not installed")


def _arrays(dtype, acc, n=1037, seed=0):
    rng = np.random.default_rng(seed)
    p = rng.standard_normal(n).astype(dtype)
    g = rng.standard_normal(n).astype(dtype)
    m = (0.1 * rng.standard_normal(n)).astype(acc)
    v = np.abs(0.1 * rng.standard_normal(n)).astype(acc)
    return p, g, m, v


@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("dtype,acc,tol", [("float64", "float64", 1e-14),
                                           ("float32", "float32", 1e-6),
                                           ("float16", "float32", 1e-3)])
def test_cpu_adam_primitive_equals_composed_step(dtype, acc, tol, decoupled):
    assert F.has_primitive(ndl.cpu(), "adam_update")
    arrays = _arrays(dtype, acc)
    fused = [NDArray(a.copy(), dtype=str(a.dtype)) for a in arrays]
    naive = [NDArray(a.copy(), dtype=str(a.dtype)) for a in arrays]
    for step in (1, 2, 7):
        F.adam_update(*fused, step=step, lr=0.01, weight_decay=0.1, decoupled=decoupled)
        F.adam_update_naive(*naive, step=step, lr=0.01, weight_decay=0.1, decoupled=decoupled)
    for a, b, name in zip(fused, naive, "pgmv"):
        np.testing.assert_allclose(a.numpy().astype(np.float64), b.numpy().astype(np.float64),
                                   rtol=tol, atol=tol, err_msg=name)
    assert not np.array_equal(fused[0].numpy(), arrays[0])  # the parameter moved


def test_cpu_adam_primitive_is_used_by_the_optimizer_and_matches_the_course_step():
    """optim.Adam (tuned: the primitive) against the course's composed solution step."""
    np.random.seed(3)
    model_a = ndl.nn.Linear(5, 4, dtype="float64")
    model_b = ndl.nn.Linear(5, 4, dtype="float64")
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        pb.cached_data = pa.cached_data.compact() + 0
    opt_a = ndl.optim.Adam(model_a.parameters(), lr=0.05, weight_decay=0.01)
    opt_b = ndl.optim.Adam(model_b.parameters(), lr=0.05, weight_decay=0.01)
    opt_a.tuned, opt_b.tuned = True, False
    x = ndl.Tensor(np.random.randn(8, 5), dtype="float64")
    calls = []
    real = adam_cpu.adam_update
    ndl.cpu().adam_update = lambda *a: calls.append(1) or real(*a)
    try:
        for _ in range(3):
            for model, opt in ((model_a, opt_a), (model_b, opt_b)):
                opt.reset_grad()
                (model(x) ** 2).sum().backward()
                opt.step()
    finally:
        del ndl.cpu().adam_update  # back to the module's primitive
    assert len(calls) == 3 * len(model_a.parameters())
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        np.testing.assert_allclose(pa.numpy(), pb.numpy(), rtol=1e-13, atol=1e-13)

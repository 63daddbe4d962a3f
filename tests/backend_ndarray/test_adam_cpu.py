"""The CPU ``multi_tensor_adam`` primitive (adam_cpu.py, numba) against Adam's rule in NumPy
and against the course's composed step (``Adam.step`` with the primitive hidden)."""
import numpy as np
import pytest
from helpers import adam_reference

import needle as ndl
from needle.backend_ndarray import adam_cpu
from needle.backend_ndarray import fused_ops as F
from needle.backend_ndarray.ndarray import NDArray

pytestmark = pytest.mark.skipif(not adam_cpu.AVAILABLE, reason="numba not installed")
LR, B1, B2, EPS, WD = 0.01, 0.9, 0.999, 1e-8, 0.1


@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("dtype,acc,tol", [("float64", "float64", 1e-13),
                                           ("float32", "float32", 1e-5),
                                           ("float16", "float32", 2e-3)])
def test_cpu_multi_tensor_adam_follows_the_rule(dtype, acc, tol, decoupled):
    assert F.has_primitive(ndl.cpu(), "multi_tensor_adam")
    rng = np.random.default_rng(0)
    sizes = (1037, 3, 64)
    ps = [rng.standard_normal(n).astype(dtype) for n in sizes]
    arrays = [NDArray(p.copy(), dtype=dtype) for p in ps]
    ms = [NDArray(np.zeros(n, acc), dtype=acc) for n in sizes]
    vs = [NDArray(np.zeros(n, acc), dtype=acc) for n in sizes]
    want = [(p.astype(np.float64), np.zeros(p.size), np.zeros(p.size)) for p in ps]
    state = F.MultiTensorState(ndl.cpu(), len(sizes))
    for t in (1, 2, 3):
        gs = [rng.standard_normal(n).astype(dtype) for n in sizes]
        F.multi_tensor_adam(arrays, [NDArray(g, dtype=dtype) for g in gs], ms, vs, [0, 1, 2],
                            [t] * 3, state, LR, B1, B2, EPS, WD, decoupled=decoupled)
        want = [adam_reference(w[0].astype(dtype).astype(np.float64), g.astype(np.float64), w[1],
                           w[2], t, LR, B1, B2, EPS, WD, decoupled)
                for w, g in zip(want, gs)]
    for k, (a, m, v) in enumerate(zip(arrays, ms, vs)):
        for got, exp, name in ((a, want[k][0], "p"), (m, want[k][1], "m"), (v, want[k][2], "v")):
            np.testing.assert_allclose(got.numpy().astype(np.float64), exp, rtol=tol, atol=tol,
                                       err_msg=f"tensor {k} {name}")
    assert list(state.steps.numpy()) == [3, 3, 3]  # counted on the "device", as the GPU's


def test_the_optimizer_uses_the_cpu_primitive_and_matches_the_composed_step(monkeypatch):
    """optim.Adam on the CPU runs the numba step (counted), and equals the course's composed
    step (the same optimizer with the primitive hidden) to rounding."""
    np.random.seed(3)
    model_a = ndl.nn.Linear(5, 4, dtype="float64")
    model_b = ndl.nn.Linear(5, 4, dtype="float64")
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        pb.cached_data = pa.cached_data.compact() + 0
    opt_a = ndl.optim.Adam(model_a.parameters(), lr=0.05, weight_decay=0.01)
    opt_b = ndl.optim.Adam(model_b.parameters(), lr=0.05, weight_decay=0.01)
    x = ndl.Tensor(np.random.randn(8, 5), dtype="float64")
    calls = []
    dev = ndl.cpu()
    for _ in range(3):
        for model, opt in ((model_a, opt_a), (model_b, opt_b)):
            opt.reset_grad()
            (model(x) ** 2).sum().backward()
            with monkeypatch.context() as m:
                if opt is opt_a:
                    m.setattr(dev, "multi_tensor_adam",
                              lambda *a: calls.append(1) or adam_cpu.multi_tensor_adam(*a),
                              raising=False)
                else:
                    m.setattr(dev, "multi_tensor_adam", None, raising=False)
                opt.step()
    assert len(calls) == 3  # one call a step for the whole float64 group
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        np.testing.assert_allclose(pa.numpy(), pb.numpy(), rtol=1e-13, atol=1e-13)
    assert opt_a.state[0]["step"] == opt_b.state[0]["step"] == 3

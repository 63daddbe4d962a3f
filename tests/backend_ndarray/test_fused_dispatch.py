"""Fused ops reach a kernel only through optional device primitives, on any machine.

A fake device offers NumPy versions of the fused primitives (with the CUDA backend's
parameters): ops, layers and optimizers must call them there and give the same results as on
the CPU, which composes the same operations from NDArray ops. The CUDA backend itself is read
as source, so the check that it defines and binds each primitive needs no CuPy.
"""
import ast
import types
from pathlib import Path

import numpy as np
import pytest
from helpers import dropout_uniform_reference

import needle as ndl
import needle.backend_ndarray.ndarray_backend_numpy as numpy_backend
from needle import nn, ops, optim
from needle.backend_ndarray import BackendDevice
from needle.backend_ndarray import fused_ops as F

CUDA_DIR = Path(numpy_backend.__file__).resolve().parents[1] / "backend_cuda"


def _defs(path: Path) -> dict:
    """Top-level ``def``s of a source file: name -> parameter names."""
    tree = ast.parse(path.read_text())
    return {n.name: tuple(a.arg for a in n.args.args) for n in tree.body
            if isinstance(n, ast.FunctionDef)}


def _all_names(path: Path) -> list:
    """A source file's ``__all__`` list."""
    tree = ast.parse(path.read_text())
    return next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "__all__" for t in n.targets))


def _bound_names() -> set:
    """What the CUDA backend's ``_PRIMITIVES.update(...)`` calls bind: their string constants,
    and the ``__all__`` of each sibling module they iterate (``fused.__all__``)."""
    tree = ast.parse((CUDA_DIR / "ndarray_backend_cuda.py").read_text())
    alias = {a.asname or a.name: a.name for n in tree.body if isinstance(n, ast.ImportFrom)
             and n.level == 1 and not n.module for a in n.names}
    names = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "_PRIMITIVES.update"):
            continue
        for c in ast.walk(node):
            if isinstance(c, ast.Constant) and isinstance(c.value, str):
                names.add(c.value)
            elif (isinstance(c, ast.Attribute) and c.attr == "__all__"
                  and isinstance(c.value, ast.Name) and c.value.id in alias):
                names.update(_all_names(CUDA_DIR / f"{alias[c.value.id]}.py"))
    return names


@pytest.mark.parametrize("name", sorted(F.FUSED_PRIMITIVES))
def test_cuda_backend_defines_and_binds_each_fused_primitive(name):
    defs = _defs(CUDA_DIR / "fused_ops_cuda.py")
    assert defs.get(name) == F.FUSED_PRIMITIVES[name], (name, defs.get(name))
    assert name in _bound_names(), f"CUDA backend does not bind {name} to its devices"


# ---------------------------------------------------------------------- a device with primitives
def _rows(a, rows, cols):
    return a.array.reshape(rows, cols).astype(np.float64)


def softmax_rows(a, out, rows, cols):
    x = _rows(a, rows, cols)
    e = np.exp(x - x.max(1, keepdims=True))
    out.array[:] = (e / e.sum(1, keepdims=True)).reshape(-1)


def logsumexp_rows(a, out, rows, cols):
    x = _rows(a, rows, cols)
    mx = x.max(1)
    out.array[:] = np.log(np.exp(x - mx[:, None]).sum(1)) + mx


def layer_norm_fwd(x, w, b, y, mean, rstd, rows, cols, eps):
    v = _rows(x, rows, cols)
    mean.array[:] = v.mean(1)
    rstd.array[:] = 1 / np.sqrt(v.var(1) + eps)
    xhat = (v - mean.array[:, None]) * rstd.array[:, None]
    y.array[:] = (xhat * w.array + b.array).reshape(-1)


def layer_norm_bwd(dy, x, w, mean, rstd, dx, dw, db, rows, cols):
    v, g = _rows(x, rows, cols), _rows(dy, rows, cols)
    r = rstd.array[:, None].astype(np.float64)
    xhat = (v - mean.array[:, None]) * r
    gw = g * w.array
    dx.array[:] = (r * (gw - gw.mean(1, keepdims=True)
                        - xhat * (gw * xhat).mean(1, keepdims=True))).reshape(-1)
    dw.array[:] = (g * xhat).sum(0)
    db.array[:] = g.sum(0)


def multi_tensor_adam(ps, gs, ms, vs, slots, steps, hyper, cache, decoupled):
    lr, beta1, _, beta2, _, eps, weight_decay = hyper.array[:7]
    for p, g, m, v, slot in zip(ps, gs, ms, vs, slots):
        steps.array[slot] += 1
        step = steps.array[slot]
        w, grad = p.array.astype(np.float64), g.array.astype(np.float64)
        if decoupled:
            w = w - lr * weight_decay * w
        else:
            grad = grad + weight_decay * w
        m.array[:] = beta1 * m.array + (1 - beta1) * grad
        v.array[:] = beta2 * v.array + (1 - beta2) * grad * grad
        mhat, vhat = m.array / (1 - beta1 ** step), v.array / (1 - beta2 ** step)
        p.array[:] = w - lr * mhat / (np.sqrt(vhat) + eps)


def dropout(x, y, mask, prob, seed, offset):
    keep = dropout_uniform_reference(seed, offset, x.size) >= prob
    mask.array[:] = keep
    y.array[:] = np.where(keep, x.array / (1 - prob), 0)


def dropout_backward(dy, mask, dx, prob):
    dx.array[:] = np.where(mask.array, dy.array / (1 - prob), 0)


@pytest.fixture
def fake():
    """A device named "fake": the NumPy backend plus recording versions of every primitive."""
    calls = []
    mod = types.SimpleNamespace(**{k: getattr(numpy_backend, k) for k in dir(numpy_backend)
                                   if not k.startswith("__")})
    here = globals()
    for name in (*F.FUSED_PRIMITIVES, "multi_tensor_adam"):
        def record(*args, _fn=here[name], _name=name):
            calls.append(_name)
            return _fn(*args)
        setattr(mod, name, record)
    dev = BackendDevice("fake", mod)
    dev.calls = calls
    return dev


def _run(device, fn, *arrays):
    ts = [ndl.Tensor(a, device=device, dtype="float64") for a in arrays]
    out = fn(*ts)
    out.sum().backward() if out.shape else out.backward()
    return [out.numpy()] + [t.grad.numpy() for t in ts if t.grad is not None]


@pytest.mark.parametrize("name,fn,prims", [
    ("layer_norm", lambda x, w, b: ops.layer_norm(x, w, b), ["layer_norm_fwd", "layer_norm_bwd"]),
    ("softmax", lambda x, w, b: ops.softmax(x) * x, ["softmax_rows"]),
    ("logsumexp", lambda x, w, b: ops.logsumexp(x, axes=(1,)), ["logsumexp_rows"]),
], ids=["layer_norm", "softmax", "logsumexp"])
def test_ops_use_the_device_primitive_and_agree_with_the_cpu(fake, name, fn, prims):
    x, w, b = np.random.randn(4, 6), np.random.randn(6), np.random.randn(6)
    want = _run(ndl.cpu(), fn, x, w, b)
    got = _run(fake, fn, x, w, b)
    assert set(prims) <= set(fake.calls), fake.calls
    assert len(got) == len(want)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("opt_cls", [optim.Adam, optim.AdamW])
def test_adam_uses_the_device_primitive_and_agrees_with_the_cpu(fake, opt_cls, monkeypatch):
    """On the fake device Adam takes its multi-tensor step; on the CPU (its numba step
    hidden) the course's composed step: the same numbers."""
    monkeypatch.setattr(ndl.cpu(), "multi_tensor_adam", None, raising=False)
    w0, g0 = np.random.randn(5, 3), np.random.randn(5, 3)
    results = []
    for dev in (ndl.cpu(), fake):
        p = nn.Parameter(ndl.Tensor(w0, device=dev, dtype="float64"))
        opt = opt_cls([p], lr=0.01, weight_decay=0.1)
        for _ in range(3):
            p.grad = ndl.Tensor(g0, device=dev, dtype="float64")
            opt.step()
        results.append(p.numpy())
    assert fake.calls == ["multi_tensor_adam"] * 3
    np.testing.assert_allclose(results[1], results[0], rtol=1e-10, atol=1e-12)


def test_dropout_uses_the_device_primitive(fake):
    np.random.seed(5)
    x = ndl.Tensor(np.ones((20, 30)), device=fake, dtype="float64")
    y = nn.Dropout(0.25)(x)
    y.sum().backward()
    assert fake.calls == ["dropout"]
    keep = y.numpy() != 0
    assert 0.6 < keep.mean() < 0.9
    np.testing.assert_allclose(y.numpy()[keep], 1 / 0.75)
    np.testing.assert_allclose(x.grad.numpy(), keep / 0.75)
    assert (nn.Dropout(0.25).eval()(x).numpy() == 1).all()

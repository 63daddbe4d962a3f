"""Multi-tensor optimizer steps (multi_tensor.cu: all parameters of a dtype in one or two
launches, updated in place) against the per-parameter steps, on the CUDA device (the
emulator where there is no GPU): Adam, AdamW and SGD; float32, float64 and float16 parameters
(float32 state); a parameter without a gradient, tied parameters, gradients of another dtype
or not compact; the step counts, state_dict and the launches, uploads and allocations."""
import numpy as np
import pytest

import needle as ndl
from needle import optim
from needle.backend_ndarray import NDArray
from needle.backend_ndarray import fused_ops as F

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not ndl.cuda().enabled(), reason="no CUDA GPU / CuPy (or "
                                 "NEEDLE_CUDA_EMULATOR=1 for the emulator)")]

SHAPES = [(3, 4), (5,), (1,), (70001,), (0, 3), (2, 3, 5)]  # (70001,): two chunks
HYPER = dict(lr=0.01, weight_decay=0.1)
ACC = {"float16": "float32", "float32": "float32", "float64": "float64"}


def _params(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [ndl.Tensor(rng.standard_normal(s).astype(dtype), device=ndl.cuda(), dtype=dtype,
                       requires_grad=True) for s in SHAPES]


def _grads(step, dtype):
    """Step ``step``'s gradients: none for param 1 on odd steps, param 2's in float64 (another
    dtype), param 5's a transposed (not compact) view."""
    rng = np.random.default_rng(100 + step)
    out = []
    for k, s in enumerate(SHAPES):
        g = rng.standard_normal(s)
        if k == 1 and step % 2:
            out.append(None)
        elif k == 2:
            out.append(NDArray(g, device=ndl.cuda()))  # float64 for any param dtype
        elif k == 5:
            gt = np.ascontiguousarray(g.transpose(2, 1, 0)).astype(dtype)
            out.append(NDArray(gt, device=ndl.cuda()).permute((2, 1, 0)))
        else:
            out.append(NDArray(g.astype(dtype), device=ndl.cuda()))
    return out


def _set_grads(params, grads):
    for p, g in zip(params, grads):
        p.grad = None if g is None else ndl.Tensor(g, device=ndl.cuda(), requires_grad=False)


@pytest.fixture
def per_parameter(monkeypatch):
    """Run ``fn`` with the device's multi-tensor primitives hidden (the per-parameter path)."""
    dev = ndl.cuda()

    def run(fn):
        with monkeypatch.context() as m:
            m.setattr(dev, "multi_tensor_adam", None, raising=False)
            m.setattr(dev, "multi_tensor_sgd", None, raising=False)
            assert not F.has_primitive(dev, "multi_tensor_adam")
            fn()
    assert F.has_primitive(dev, "multi_tensor_adam") and F.has_primitive(dev, "multi_tensor_sgd")
    return run


def _adam_reference(params_np, steps, cls, dtype):
    """The multi-tensor step run on one parameter at a time (a table of one, its own step
    counts), accumulator-dtype state, steps counted per param."""
    ps = [NDArray(w, device=ndl.cuda()) for w in params_np]
    states = [F.MultiTensorState(ndl.cuda(), 1) for _ in ps]
    ms = [NDArray(np.zeros(w.shape, ACC[dtype]), device=ndl.cuda()) for w in params_np]
    vs = [NDArray(np.zeros(w.shape, ACC[dtype]), device=ndl.cuda()) for w in params_np]
    count = [0] * len(ps)
    for step in range(steps):
        for k, g in enumerate(_grads(step, dtype)):
            if g is None:
                continue
            count[k] += 1
            F.multi_tensor_adam([ps[k]], [g.astype(dtype).compact()], [ms[k]], [vs[k]], [0],
                                [count[k]], states[k], decoupled=cls.decoupled, **HYPER)
    return ps, ms, vs, count


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW])
def test_multi_tensor_adam_matches_one_tensor_at_a_time(cls, dtype):
    params = _params(dtype)
    start = [p.numpy() for p in params]
    opt = cls(params + [params[0]], **HYPER)  # a tied parameter: listed twice, updated once
    handles = []
    for step in range(4):
        _set_grads(params, _grads(step, dtype))
        opt.step()
        handles.append([p.cached_data._handle for p in params])
    assert handles[1] == handles[3], "parameters are updated in place after the first step"
    ps, ms, vs, count = _adam_reference(start, 4, cls, dtype)
    for k, p in enumerate(params):
        np.testing.assert_array_equal(p.numpy(), ps[k].numpy())
        np.testing.assert_array_equal(opt.state[k]["m"].numpy(), ms[k].numpy())
        np.testing.assert_array_equal(opt.state[k]["v"].numpy(), vs[k].numpy())
        assert opt.state[k]["step"] == count[k] and type(opt.state[k]["step"]) is int
    assert count[1] == 2 and count[0] == 4  # the parameter without a gradient did not count


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float64", 1e-12)])
@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW])
def test_multi_tensor_adam_matches_the_course_step(per_parameter, cls, dtype, tol):
    fast, plain = _params(dtype), _params(dtype)
    opt_fast, opt_plain = cls(fast, **HYPER), cls(plain, **HYPER)
    for step in range(4):
        _set_grads(fast, _grads(step, dtype))
        _set_grads(plain, _grads(step, dtype))
        opt_fast.step()
        per_parameter(opt_plain.step)
    for k, (a, b) in enumerate(zip(fast, plain)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=tol, atol=tol)
        assert opt_fast.state[k]["step"] == opt_plain.state[k]["step"]


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-6), ("float64", 1e-14), ("float16", 2e-3)])
@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.5, 0.05)])
def test_multi_tensor_sgd_matches_the_course_step(per_parameter, dtype, tol, momentum,
                                                 weight_decay):
    fast, plain = _params(dtype), _params(dtype)
    kw = dict(lr=0.1, momentum=momentum, weight_decay=weight_decay)
    opt_fast, opt_plain = optim.SGD(fast + [fast[3]], **kw), optim.SGD(plain, **kw)
    start = [p.numpy().astype(np.float64) for p in fast]
    handles = None
    for step in range(4):
        _set_grads(fast, _grads(step, dtype))
        _set_grads(plain, _grads(step, dtype))
        opt_fast.step()
        per_parameter(opt_plain.step)
        now = [p.cached_data._handle for p in fast]
        assert handles is None or now == handles
        handles = now
    assert sorted(opt_fast.u) == sorted(opt_plain.u)
    for k, (a, b) in enumerate(zip(fast, plain)):
        if dtype != "float16":  # the course step keeps float16 momentum: compare to float64
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=tol, atol=tol)
            continue
        w, u = start[k], np.zeros(SHAPES[k])
        for step in range(4):
            g = _grads(step, dtype)[k]
            if g is None:
                continue
            g = g.numpy().astype(dtype).astype(np.float64) + weight_decay * w
            u = momentum * u + (1 - momentum) * g if momentum else g
            w = w - 0.1 * u
        np.testing.assert_allclose(a.numpy().astype(np.float64), w, rtol=tol, atol=tol)


def test_state_dict_round_trip_and_changed_hyperparameters(per_parameter):
    a, b = _params("float32"), _params("float32")
    opt_a, opt_b = optim.Adam(a, **HYPER), optim.Adam(b, **HYPER)
    for step in range(3):
        _set_grads(a, _grads(step, "float32"))
        opt_a.step()
    saved = opt_a.state_dict()
    assert saved["state"]["1"]["step"] == 2 and saved["state"]["0"]["step"] == 3
    for p, q in zip(a, b):
        q.cached_data = NDArray(p.numpy(), device=ndl.cuda())
    opt_b.load_state_dict(saved)
    for opt in (opt_a, opt_b):
        opt.lr = 0.003  # a new learning rate reaches the device
    for step in range(3, 6):
        _set_grads(a, _grads(step, "float32"))
        _set_grads(b, _grads(step, "float32"))
        opt_a.step()
        opt_b.step()
    for k, (p, q) in enumerate(zip(a, b)):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
        assert opt_a.state[k]["step"] == opt_b.state[k]["step"]
    # stepping elsewhere (the course's plain step) leaves the device's counts behind: resynced
    _set_grads(a, _grads(6, "float32"))
    _set_grads(b, _grads(6, "float32"))
    per_parameter(opt_a.step)
    opt_b.step()
    for step in range(7, 9):
        _set_grads(a, _grads(step, "float32"))
        _set_grads(b, _grads(step, "float32"))
        opt_a.step()
        opt_b.step()
    for p, q in zip(a, b):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=1e-6)


def test_float16_state_loaded_as_float16_steps_in_float32():
    a, b = _params("float16"), _params("float16")
    opt_a, opt_b = optim.Adam(a, **HYPER), optim.Adam(b, **HYPER)
    _set_grads(a, _grads(0, "float16"))
    opt_a.step()
    opt_b.load_state_dict(opt_a.state_dict())  # load_state_dict casts m, v to float16
    assert opt_b.state[0]["m"].dtype == "float16"
    for p, q in zip(a, b):
        q.cached_data = NDArray(p.numpy(), device=ndl.cuda())
    _set_grads(b, _grads(1, "float16"))
    opt_b.step()
    assert opt_b.state[0]["m"].dtype == "float32" and opt_b.state[0]["step"] == 2


def test_an_adam_step_is_two_launches_and_uploads_only_what_changed():
    counts = pytest.importorskip("needle.backend_cuda.emulator.counts")
    if not getattr(ndl.cuda().mod, "EMULATED", False):
        pytest.skip("counts are read at the emulator's CuPy surface")
    params = [p for p in _params("float32") if p.shape != (0, 3)]
    opt = optim.Adam(params, **HYPER)
    grads = [NDArray(np.ones(p.shape, "float32"), device=ndl.cuda()) for p in params]
    _set_grads(params, grads)
    opt.step()  # the first step creates the state and uploads counts and hyperparameters
    with counts.counting() as same:  # the same gradient buffers: the cached table
        opt.step()
    assert same.totals() == dict(launch=2, library=0, alloc=0, h2d=0, d2h=0, sync=0, graph=0)
    _set_grads(params, [NDArray(g.numpy(), device=ndl.cuda()) for g in grads])
    with counts.counting() as new:  # new gradient buffers: one table upload
        opt.step()
    assert new.totals() == dict(launch=2, library=0, alloc=0, h2d=1, d2h=0, sync=0, graph=0)
    opt.lr = 0.5
    with counts.counting() as hyper:  # a changed hyperparameter: one upload
        opt.step()
    assert hyper.totals()["h2d"] == 1 and hyper.totals()["launch"] == 2
    sgd = optim.SGD(params, lr=0.1, momentum=0.9)
    sgd.step()
    with counts.counting() as c:
        sgd.step()
    assert c.totals() == dict(launch=1, library=0, alloc=0, h2d=0, d2h=0, sync=0, graph=0)

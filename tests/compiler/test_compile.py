"""needle.compile: compiled == eager (values and gradients), guards, fallbacks, explain, lazy.

Every comparison runs the same function eagerly on one copy of the inputs/model and compiled
on another; the compiled function is called three times (record, record and compare, then
replay) and the *replay* is what is checked. Fused kernels keep NumPy's order of operations
(reductions stay NumPy reductions), so float64 results agree to 1e-12; the only differences
are last-bit ones from exp/log/tanh evaluated by another math library inside a kernel.
"""
import importlib

import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.backend_ndarray import fused_elementwise_cpu
from needle.compiler import DataDependentError
from needle.compiler.fusion import fuse

op_table = importlib.import_module("ops.op_table")
OPS, make_inputs = op_table.OPS, op_table.make_inputs
TOL = dict(rtol=1e-12, atol=1e-12)


def _as_list(out):
    return list(out) if isinstance(out, (tuple, list, ndl.TensorTuple)) else [out]


def _op_params():
    return [pytest.param(name, case, id=f"{name}-{i}")
            for name, spec in OPS.items() for i, case in enumerate(spec.cases)]


def _loss_fn(name, case, weights):
    def f(*xs):
        outs = _as_list(OPS[name].fn(*xs, **case.kw))
        loss = None
        for o, w in zip(outs, weights):
            if not ndl.autograd._is_float(o.realize_cached_data()):
                continue
            term = (o * ndl.Tensor(w, dtype="float64", requires_grad=False)).sum()
            loss = term if loss is None else loss + term
        if loss is not None and loss.requires_grad:
            loss.backward()
        return outs
    return f


@pytest.fixture
def numpy_engine(monkeypatch):
    """The NumPy kernel engine: ~200 distinct op kernels would each cost numba ~0.2 s to
    build on a fresh machine; numba's kernels are checked by the model steps below."""
    monkeypatch.setattr(fused_elementwise_cpu, "ENGINE", "numpy")


@pytest.mark.parametrize("name,case", _op_params())
def test_every_op_compiled_equals_eager(name, case, numpy_engine):
    arrays = make_inputs(name, case)
    eager_in = [ndl.Tensor(a, dtype="float64") for a in arrays]
    shapes = [o.shape for o in _as_list(OPS[name].fn(*eager_in, **case.kw))]
    rng = np.random.default_rng(1)
    weights = [rng.standard_normal(s) for s in shapes]
    f = _loss_fn(name, case, weights)
    want = [o.numpy() for o in f(*eager_in)]
    want_grads = [None if x.grad is None else x.grad.numpy() for x in eager_in]
    cf = ndl.compile(f)
    for _ in range(3):
        xs = [ndl.Tensor(a, dtype="float64") for a in arrays]
        got = cf(*xs)
    assert cf.replays + cf.eager_calls == 1  # the third call replayed (or runs eagerly)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, **TOL)
    for x, wg in zip(xs, want_grads):
        if wg is None:
            assert x.grad is None
        else:
            np.testing.assert_allclose(x.grad.numpy(), wg, **TOL)


def _mlp(seed=0):
    np.random.seed(seed)
    return nn.Sequential(nn.Linear(12, 32, dtype="float64"), nn.ReLU(),
                         nn.Linear(32, 32, dtype="float64"), nn.Tanh(),
                         nn.Linear(32, 5, dtype="float64"))


def _lm(seed=0, layers=2, d=16, seq=8):
    np.random.seed(seed)
    emb = nn.Embedding(50, d, gather=True, dtype="float64")
    body = nn.Transformer(d, 32, layers, num_head=2, dim_head=8, sequence_len=seq,
                          dtype="float64")
    head = nn.Linear(d, 50, dtype="float64")
    return emb, body, head


def _params_of(model):
    return [p for m in model for p in m.parameters()] if isinstance(model, tuple) \
        else model.parameters()


def _step_fn(kind, model):
    loss_fn = nn.SoftmaxLoss()
    if kind == "mlp":
        def f(x, y):
            loss = loss_fn(model(x), y)
            loss.backward()
            return loss
    else:
        emb, body, head = model

        def f(x, y):
            out, _ = body(emb(x))
            t, b = x.shape
            loss = loss_fn(head(out.reshape((t * b, out.shape[-1]))), y)
            loss.backward()
            return loss
    return f


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_training_steps_compiled_equal_eager(kind):
    """Three Adam steps: losses, gradients and updated weights agree (float64, 1e-12)."""
    rng = np.random.default_rng(0)
    if kind == "mlp":
        models = [_mlp(), _mlp()]
        data = [(rng.standard_normal((16, 12)), rng.integers(0, 5, 16)) for _ in range(4)]
    else:
        models = [_lm(), _lm()]
        data = [(rng.integers(0, 50, (8, 3)), rng.integers(0, 50, 24)) for _ in range(4)]
    fns = [_step_fn(kind, models[0]), ndl.compile(_step_fn(kind, models[1]))]
    opts = [ndl.optim.Adam(_params_of(m), lr=1e-2) for m in models]
    for x, y in data:
        losses = []
        for fn, opt in zip(fns, opts):
            opt.reset_grad()
            xt = ndl.Tensor(x, dtype="float64" if kind == "mlp" else "int64",
                            requires_grad=False)
            losses.append(fn(xt, ndl.Tensor(y, dtype="int64")).numpy())
            opt.step()
        np.testing.assert_allclose(losses[1], losses[0], **TOL)
        for pe, pc in zip(_params_of(models[0]), _params_of(models[1])):
            np.testing.assert_allclose(pc.grad.numpy(), pe.grad.numpy(), **TOL)
            np.testing.assert_allclose(pc.numpy(), pe.numpy(), **TOL)
    assert fns[1].replays == 2 and fns[1].compiles == 1
    assert fns[1].program().stats()["fused_groups"] > 0


def test_recompiles_on_a_new_shape_only():
    model = _mlp()
    cf = ndl.compile(_step_fn("mlp", model))
    rng = np.random.default_rng(0)

    def call(n):
        return cf(ndl.Tensor(rng.standard_normal((n, 12)), dtype="float64"),
                  ndl.Tensor(rng.integers(0, 5, n), dtype="int64"))
    for _ in range(5):
        call(8)
    assert (cf.compiles, cf.recordings, cf.replays) == (1, 2, 3)
    for _ in range(3):
        call(4)
    assert (cf.compiles, cf.recordings, cf.replays) == (2, 4, 4)
    call(8)  # the first program is still cached
    assert (cf.compiles, cf.replays) == (2, 5)


def test_new_batch_values_replay_correctly():
    """A replay computes from the new inputs, not the traced ones."""
    f = ndl.compile(lambda x: (ndl.ops.exp(x) * 2 + 1).sum(axes=(1,)))
    rng = np.random.default_rng(0)
    for _ in range(4):
        a = rng.standard_normal((4, 6))
        got = f(ndl.Tensor(a, dtype="float64")).numpy()
        np.testing.assert_allclose(got, (np.exp(a) * 2 + 1).sum(1), **TOL)
    assert f.replays == 2


def test_debug_says_why_it_recompiles(capsys):
    f = ndl.compile(lambda x: x * 2 + 1, debug=True)
    f(ndl.Tensor(np.ones((2, 3))))
    f(ndl.Tensor(np.ones((5, 3))))
    assert "new signature" in capsys.readouterr().out


def _data_dependent(x):
    if x.sum().numpy() > 0:  # Python control flow on tensor data
        return x * 2
    return x * 3


def test_data_dependent_control_flow_falls_back_to_eager():
    f = ndl.compile(_data_dependent)
    for sign in (1, -1, 1, -1):
        a = np.full((3,), float(sign))
        np.testing.assert_array_equal(f(ndl.Tensor(a)).numpy(), a * (2 if sign > 0 else 3))
    assert f.compiles == 0 and "reads tensor data" in f.explain()


def test_data_dependent_control_flow_refused_when_strict():
    f = ndl.compile(_data_dependent, fallback=False)
    with pytest.raises(DataDependentError, match="reads tensor data"):
        f(ndl.Tensor(np.ones(3)))


def test_random_draws_are_never_replayed():
    """Dropout draws a new mask each call: recordings differ, so it keeps running eagerly."""
    drop = nn.Dropout(0.5)
    f = ndl.compile(lambda x: drop(x))
    masks = {tuple(f(ndl.Tensor(np.ones(64))).numpy() > 0) for _ in range(6)}
    assert len(masks) > 1 and f.compiles == 0


def test_attribute_state_is_replayed():
    """Tensors a function stores on an object (attention probs) are updated by replays."""
    model = _lm()
    f = ndl.compile(_step_fn("transformer", model))
    rng = np.random.default_rng(0)
    for _ in range(3):
        f(ndl.Tensor(rng.integers(0, 50, (8, 3)), dtype="int64"),
          ndl.Tensor(rng.integers(0, 50, 24), dtype="int64"))
    attn = [m for _, m in model[1].named_modules() if hasattr(m, "probs")]
    before = [a.probs for a in attn]
    x = rng.integers(0, 50, (8, 3))
    f(ndl.Tensor(x, dtype="int64"), ndl.Tensor(rng.integers(0, 50, 24), dtype="int64"))
    assert f.replays == 2 and len(attn) == 2
    for a, old in zip(attn, before):
        assert a.probs is not old  # rebound by the replay, as the eager call does
        np.testing.assert_allclose(a.probs.numpy().sum(-1), 1.0, rtol=1e-12)


def test_explain_shows_the_graph_before_and_after_fusion():
    """A forward-only program (no input requires a gradient, so nothing is saved for a
    backward and the whole chain after the matmul fuses)."""
    f = ndl.compile(lambda x, w: ndl.ops.relu(x @ w + 1.0).sum(axes=(1,)))
    x = ndl.Tensor(np.ones((4, 8)), requires_grad=False)
    w = ndl.Tensor(np.ones((8, 8)), requires_grad=False)
    for _ in range(2):
        f(x, w)
    text = f.explain()
    assert "== before fusion: 4 primitive calls" in text
    assert "== after fusion: 2 kernels (1 fused)" in text
    assert "fused[s_add+s_maximum+reduce_sum] then sum" in text


def test_fusion_keeps_visible_buffers():
    """A value the caller can see (an output) is never inlined away."""
    def f(x):
        y = x * 2
        return y + 1, y
    f = ndl.compile(f)
    x = ndl.Tensor(np.arange(6.0))
    for _ in range(3):
        a, b = f(x)
    np.testing.assert_array_equal(a.numpy(), np.arange(6.0) * 2 + 1)
    np.testing.assert_array_equal(b.numpy(), np.arange(6.0) * 2)
    program = f.program(x)
    groups, _, _ = fuse(program.trace, set(program.outputs) | set(program.inputs))
    assert all(g is None or len(g.members) == 1 for g in groups)


def test_results_of_earlier_calls_are_not_overwritten():
    f = ndl.compile(lambda x: x * 2 + 1)
    outs = [f(ndl.Tensor(np.full(3, float(i)))) for i in range(4)]
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(o.numpy(), np.full(3, 2.0 * i + 1))


def test_lazy_block_fuses_and_matches_eager():
    a = np.random.default_rng(0).standard_normal((5, 7))
    with ndl.lazy() as lz:
        x = ndl.Tensor(a, dtype="float64", requires_grad=False)  # no graph holds temporaries
        y = ndl.ops.tanh(x * 3 + 1) * x
        s = y.sum(axes=(1,))
    np.testing.assert_allclose(s.numpy(), (np.tanh(a * 3 + 1) * a).sum(1), **TOL)
    np.testing.assert_allclose(y.numpy(), np.tanh(a * 3 + 1) * a, **TOL)
    assert "fused[" in lz.explain()


def test_lazy_block_flushes_on_a_read():
    with ndl.lazy():
        x = ndl.Tensor(np.arange(4.0), dtype="float64")
        y = x * 2 + 1
        first = y.numpy()  # forces the queued kernels to run
        z = y * y
    np.testing.assert_array_equal(first, np.arange(4.0) * 2 + 1)
    np.testing.assert_array_equal(z.numpy(), (np.arange(4.0) * 2 + 1) ** 2)


@pytest.mark.parametrize("engine", ["numpy", "numba"])
def test_fused_elementwise_engines_agree(engine):
    pytest.importorskip(engine)
    rng = np.random.default_rng(0)
    expr = "t0 = x0 - x1; t1 = where((t0 >= c0) | (t0 != t0), t0, c0); out = t1 * x1 + c1"
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 6)).T  # b is transposed
    views = [a, b, np.float64(0.0), np.float64(1.5)]
    out = np.empty((6, 5))
    fused_elementwise_cpu.kernel_for(expr, views, out, engine=engine)(views, out)
    np.testing.assert_allclose(out, np.maximum(a - b, 0) * b + 1.5, **TOL)



def test_unknown_fused_engine_is_refused(monkeypatch):
    monkeypatch.setenv("NEEDLE_FUSED_ENGINE", "numexpr")  # an engine needle no longer has
    with pytest.raises(ValueError, match="NEEDLE_FUSED_ENGINE='numexpr'.*numba"):
        fused_elementwise_cpu._engine_from_env()

def test_index_checks_run_on_every_replay():
    """Label/embedding bounds are checked by each replay, as eager checks them."""
    model = _mlp()
    cf = ndl.compile(_step_fn("mlp", model))
    x = ndl.Tensor(np.ones((4, 12)), dtype="float64")
    for _ in range(3):
        cf(x, ndl.Tensor(np.array([0, 1, 2, 3]), dtype="int64"))
    assert cf.replays == 1
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        cf(x, ndl.Tensor(np.array([0, 1, 2, 5]), dtype="int64"))


@pytest.mark.parametrize("shape", [(5,), (3, 7), (40000,), (3, 50000), (2, 3, 128, 130),
                                   (70000, 1)])
def test_numpy_engine_blocks_cover_every_element_once(shape):
    hits = np.zeros(shape, dtype=np.int64)
    for idx in fused_elementwise_cpu._blocks(shape):
        hits[idx] += 1
        assert hits[idx].size <= max(fused_elementwise_cpu.BLOCK, shape[-1])
    np.testing.assert_array_equal(hits, 1)


@pytest.mark.parametrize("engine", ["numpy", "numba"])
def test_blocked_kernels_equal_unfused_numpy_bit_for_bit(engine, monkeypatch):
    """Many blocks, a transposed and a broadcast input, exp: the same bits as one NumPy
    pass per op (blocking and fusion change no operation, only where results live)."""
    pytest.importorskip(engine)
    monkeypatch.setattr(fused_elementwise_cpu, "ENGINE", engine)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((300, 257)).astype(np.float32)
    b = rng.standard_normal((257, 300)).astype(np.float32).T       # transposed
    m = rng.standard_normal(300).astype(np.float32)[:, None]       # broadcast over columns
    for expr, ref in [
            ("t0 = x0 - x2; t1 = exp(t0); out = t1 * x1 + c0",
             np.exp(a - m) * b + np.float32(0.5)),
            ("t0 = x0 * x1; out = t0 - x2 + c0", a * b - m + np.float32(0.5))]:
        out = np.empty_like(a)
        views = [a, b, np.broadcast_to(m, a.shape), np.float32(0.5)]
        fused_elementwise_cpu.kernel_for(expr, views, out)(views, out)
        np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("rows,cols,inner", [(3000, 128, 1), (7, 1000, 1), (1, 1024, 33),
                                             (5, 3, 1), (600, 130, 4)])
def test_fused_reduction_equals_map_then_numpy_reduce_bit_for_bit(op, rows, cols, inner):
    """A fused reduction sums in NumPy's (pairwise) order: the same bits as unfused steps."""
    from needle.backend_ndarray.ndarray_backend_numpy import Array
    rng = np.random.default_rng(2)
    n = rows * cols * inner
    arrays = []
    for _ in range(2):
        x = Array(n, dtype=np.float64)
        x.array[:] = rng.standard_normal(n)
        arrays.append(x)
    out = Array(rows * inner, dtype=np.float64)
    for expr, fn in [("t0 = x0 * x1; out = t0 + c0", lambda p, q: p * q + 0.25),
                     ("t0 = x0 - x1; out = exp(t0)", lambda p, q: np.exp(p - q))]:
        fused_elementwise_cpu.fused_elementwise(expr, [(x, (n,), (1,), 0) for x in arrays]
                                     + [np.float64(0.25)], out, (n,), (op, cols, inner))
        mapped = fn(arrays[0].array, arrays[1].array).reshape(rows, cols, inner)
        ufunc = np.add if op == "sum" else np.maximum
        np.testing.assert_array_equal(out.array.reshape(rows, inner),
                                      ufunc.reduce(mapped, axis=1))


def test_division_by_zero_in_a_fused_kernel_gives_inf_and_nan_as_eager(monkeypatch):
    """numba's default error model raises ZeroDivisionError; NumPy's (and eager's) gives inf."""
    pytest.importorskip("numba")
    monkeypatch.setattr(fused_elementwise_cpu, "ENGINE", "numba")
    f = ndl.compile(lambda x, y: (x / y) * 2.0 + 1.0)
    x = ndl.Tensor(np.array([1.0, 0.0, -1.0, 2.0]))
    y = ndl.Tensor(np.array([0.0, 0.0, 0.0, 4.0]))
    with np.errstate(divide="ignore", invalid="ignore"):
        eager = ((x / y) * 2.0 + 1.0).numpy()
        for _ in range(3):
            got = f(x, y).numpy()
    assert f.replays == 1 and "fused[div+s_mul+s_add]" in f.explain()
    np.testing.assert_array_equal(got, eager)  # [inf, nan, -inf, 2.0]


_SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.5, 1e-310, 3e300, -2.0])


@pytest.mark.parametrize("name,fn", [
    ("div-chain", lambda x, y: (x / y) * y - x),
    ("max-relu", lambda x, y: ndl.ops.relu(x * 2.0 - y) + ndl.ops.maximum(x, y)),
    ("neg-sub-relu", lambda x, y: -(x - y) * 0.5 + ndl.ops.relu(-x) - (y + 2.0)),
    ("scalar-div", lambda x, y: (x + 1.0) / 0.0 + y * 0.0),
], ids=lambda v: v if isinstance(v, str) else "")
def test_fused_numba_kernels_match_eager_on_special_values(name, fn, monkeypatch):
    """inf, nan, signed zeros and subnormals through arithmetic chains: the compiled kernel
    gives eager's bits (the sign of zero included), NaN where eager has NaN."""
    pytest.importorskip("numba")
    monkeypatch.setattr(fused_elementwise_cpu, "ENGINE", "numba")
    xs, ys = np.meshgrid(_SPECIAL, _SPECIAL)
    x, y = ndl.Tensor(xs.ravel(), dtype="float64"), ndl.Tensor(ys.ravel(), dtype="float64")
    f = ndl.compile(fn)
    with np.errstate(all="ignore"):
        eager = fn(x, y).numpy()
        for _ in range(3):
            got = f(x, y).numpy()
    assert f.replays == 1 and "fused[" in f.explain()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(eager))
    ok = ~np.isnan(eager)
    np.testing.assert_array_equal(got[ok].view(np.int64), eager[ok].view(np.int64))


@pytest.mark.parametrize("bad, error", [(3, TypeError), ("step", TypeError)])
def test_compile_refuses_what_is_not_a_function_and_an_unknown_mode(bad, error):
    with pytest.raises(error, match="expected a function or a module, got"):
        ndl.compile(bad)
    with pytest.raises(ValueError, match="mode='fast'; expected one of"):
        ndl.compile(lambda x: x, mode="fast")

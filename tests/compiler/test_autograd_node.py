"""Compiled results carry a graph: ``compiled(x).backward()`` gives eager's gradients.

Each test runs the same model eagerly on one copy and compiled on another (float64), calls
``backward`` *outside* the compiled function, and compares values and every gradient to
1e-12 on calls that replay the plans (the third call onwards).
"""
import numpy as np
import pytest

import needle as ndl
from needle import nn

TOL = dict(rtol=1e-12, atol=1e-12)


def _mlp(seed=0):
    np.random.seed(seed)
    return nn.Sequential(nn.Linear(6, 16, dtype="float64"), nn.ReLU(),
                         nn.Linear(16, 16, dtype="float64"), nn.Tanh(),
                         nn.Linear(16, 3, dtype="float64"))


def _lm(seed=0, d=16, seq=8):
    np.random.seed(seed)
    return nn.Sequential(nn.Embedding(30, d, gather=True, dtype="float64"),
                         _Body(nn.Transformer(d, 32, 2, num_head=2, dim_head=8,
                                              sequence_len=seq, dtype="float64")),
                         nn.Linear(d, 30, dtype="float64"))


class _Body(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return self.body(x)[0]


def _grads(params):
    return [p.grad.numpy() for p in params]


def _reset(params):
    for p in params:
        p.grad = None


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_backward_outside_equals_eager(kind):
    """Loss, input gradient (MLP) and parameter gradients, on four calls of new data."""
    models = [_mlp(), _mlp()] if kind == "mlp" else [_lm(), _lm()]
    compiled = ndl.compile(models[1])
    rng = np.random.default_rng(0)
    for _ in range(4):
        if kind == "mlp":
            data = rng.standard_normal((5, 6))
            w = rng.standard_normal((5, 3))
        else:
            data = rng.integers(0, 30, (8, 2))
            w = rng.standard_normal((8, 2, 30))
        got = []
        for fn, model in ((models[0], models[0]), (compiled, models[1])):
            _reset(model.parameters())
            x = ndl.Tensor(data, dtype="float64" if kind == "mlp" else "int64")
            loss = (fn(x) * ndl.Tensor(w, dtype="float64", requires_grad=False)).sum()
            loss.backward()
            got.append([loss.numpy()] + _grads(model.parameters())
                       + ([x.grad.numpy()] if kind == "mlp" else []))
        for g, e in zip(got[1], got[0]):
            np.testing.assert_allclose(g, e, **TOL)
    assert (compiled.compiled.compiles, compiled.compiled.replays) == (1, 2)


def test_loss_computed_inside_backward_outside():
    """The usual ``loss = compiled(x, y); loss.backward()`` with the loss inside."""
    models = [_mlp(), _mlp()]
    loss_fn = nn.SoftmaxLoss()
    fns = [lambda x, y: loss_fn(models[0](x), y),
           ndl.compile(lambda x, y: loss_fn(models[1](x), y))]
    rng = np.random.default_rng(1)
    opts = [ndl.optim.Adam(m.parameters(), lr=1e-2) for m in models]
    for _ in range(4):
        data, labels = rng.standard_normal((7, 6)), rng.integers(0, 3, 7)
        for fn, opt in zip(fns, opts):
            opt.reset_grad()
            fn(ndl.Tensor(data, dtype="float64"), ndl.Tensor(labels, dtype="int64")).backward()
            opt.step()
        for pe, pc in zip(models[0].parameters(), models[1].parameters()):
            np.testing.assert_allclose(pc.grad.numpy(), pe.grad.numpy(), **TOL)
            np.testing.assert_allclose(pc.numpy(), pe.numpy(), **TOL)
    assert fns[1].replays == 2


def _two_outputs(x, w):
    h = ndl.ops.tanh(x @ w)
    return h.sum(axes=(1,)), ndl.ops.exp(h * 0.5)


def test_several_results_and_several_live_graphs():
    """Two differentiable results per call, the graphs of three calls alive at once, one
    backward through all of them: each call's node kept its own saved arrays."""
    rng = np.random.default_rng(2)
    w_data = rng.standard_normal((4, 3))
    xs = [rng.standard_normal((5, 4)) for _ in range(3)]
    results = []
    for fn in (_two_outputs, ndl.compile(_two_outputs)):
        w = ndl.Tensor(w_data, dtype="float64")
        ins = [ndl.Tensor(a, dtype="float64") for a in xs]
        for x in ins[:2]:  # two recordings first, so that the three below replay
            fn(x, w)
        outs = [fn(x, w) for x in ins]
        total = None
        for k, (a, b) in enumerate(outs):
            term = a.sum() * (k + 1.0) + (b * b).sum()
            total = term if total is None else total + term
        total.backward()
        results.append([total.numpy(), w.grad.numpy()] + [x.grad.numpy() for x in ins])
    for g, e in zip(results[1], results[0]):
        np.testing.assert_allclose(g, e, **TOL)


def test_gradient_flows_on_into_the_arguments_graph():
    """An argument computed by eager ops: backward continues from the node upstream."""
    rng = np.random.default_rng(3)
    a_data, w_data = rng.standard_normal((3, 4)), rng.standard_normal((4, 4))
    body = ndl.compile(lambda h, w: ndl.ops.relu(h @ w).sum())
    got = []
    for fn in (lambda h, w: ndl.ops.relu(h @ w).sum(), body):
        for _ in range(3):
            a, w = ndl.Tensor(a_data, dtype="float64"), ndl.Tensor(w_data, dtype="float64")
            h = ndl.ops.exp(a) * 2.0  # not a leaf
            fn(h, w).backward()
        got.append([a.grad.numpy(), w.grad.numpy()])
    assert body.replays == 1
    for g, e in zip(got[1], got[0]):
        np.testing.assert_allclose(g, e, **TOL)


def test_parameter_hooks_fire_once_in_the_real_backward_only():
    """Gradient hooks (DDP's allreduce hooks) never fire while a backward is traced."""
    model = _mlp()
    seen = []
    for p in model.parameters():
        p.register_hook(lambda g: seen.append(g.shape))
    compiled = ndl.compile(model)
    x = ndl.Tensor(np.ones((2, 6)), dtype="float64")
    for call in range(3):
        out = compiled(x)
        assert seen == []
        out.sum().backward()
        assert len(seen) == len(model.parameters()), call
        seen.clear()


def test_no_grad_gives_results_without_a_graph_and_its_own_program():
    model = _mlp()
    compiled = ndl.compile(model)
    x = ndl.Tensor(np.ones((2, 6)), dtype="float64")
    for _ in range(3):
        with ndl.no_grad():
            out = compiled(x)
        assert out.op is None and not out.requires_grad
    for _ in range(3):
        out = compiled(x)
        assert out.requires_grad and out.op is not None
    assert compiled.compiled.compiles == 2
    np.testing.assert_allclose(out.numpy(), model(x).numpy(), **TOL)


def test_new_shape_recompiles_and_both_plans_give_eager_gradients():
    model = _mlp()
    compiled = ndl.compile(model)
    rng = np.random.default_rng(4)
    for n in (4, 4, 4, 7, 7, 7, 4):
        data = rng.standard_normal((n, 6))
        _reset(model.parameters())
        model(ndl.Tensor(data, dtype="float64")).sum().backward()
        want = _grads(model.parameters())
        _reset(model.parameters())
        compiled(ndl.Tensor(data, dtype="float64")).sum().backward()
        for g, e in zip(_grads(model.parameters()), want):
            np.testing.assert_allclose(g, e, **TOL)
    assert (compiled.compiled.compiles, compiled.compiled.replays) == (2, 3)


def _reads_data(x, w):
    y = x @ w
    if y.sum().numpy() > 0:  # data-dependent control flow: runs eagerly
        return ndl.ops.relu(y).sum()
    return (y * y).sum()


def test_eager_fallback_keeps_the_graph():
    rng = np.random.default_rng(5)
    cf = ndl.compile(_reads_data)
    for sign in (1.0, -1.0, 1.0, -1.0):
        xd, wd = np.abs(rng.standard_normal((3, 4))) * sign, np.abs(rng.standard_normal((4, 2)))
        grads = []
        for fn in (_reads_data, cf):
            x, w = ndl.Tensor(xd, dtype="float64"), ndl.Tensor(wd, dtype="float64")
            fn(x, w).backward()
            grads.append((x.grad.numpy(), w.grad.numpy()))
        for g, e in zip(grads[1], grads[0]):
            np.testing.assert_allclose(g, e, **TOL)
    assert cf.compiles == 0 and cf.eager_calls == 3


def test_compiled_module_trains_like_the_module():
    """parameters(), state_dict round trip, and train()/eval() each with its own plan."""
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(6, 8, dtype="float64"), nn.BatchNorm1d(8, dtype="float64"),
                          nn.ReLU(), nn.Linear(8, 2, dtype="float64"))
    compiled = ndl.compile(model)
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in model.parameters()]
    assert compiled.eval() is compiled and not model.training
    rng = np.random.default_rng(6)
    x = ndl.Tensor(rng.standard_normal((5, 6)), dtype="float64")
    for _ in range(3):
        out_eval = compiled(x).numpy()
    np.testing.assert_allclose(out_eval, model(x).numpy(), **TOL)
    compiled.train()
    assert model.training and compiled.compiled.compiles == 1
    for _ in range(3):
        compiled(x)
    assert compiled.compiled.compiles == 2
    state = compiled.state_dict()
    other = nn.Sequential(nn.Linear(6, 8, dtype="float64"), nn.BatchNorm1d(8, dtype="float64"),
                          nn.ReLU(), nn.Linear(8, 2, dtype="float64"))
    ndl.compile(other).load_state_dict(state)
    compiled.eval()
    other.eval()
    np.testing.assert_allclose(compiled(x).numpy(), other(x).numpy(), **TOL)


def test_batchnorm_running_statistics_are_updated_by_replays():
    """BatchNorm's running mean (state kept on the module) matches eager after replays."""
    models = []
    for _ in range(2):
        np.random.seed(0)
        models.append(nn.Sequential(nn.Linear(4, 6, dtype="float64"),
                                    nn.BatchNorm1d(6, dtype="float64")))
    compiled = ndl.compile(models[1])
    rng = np.random.default_rng(7)
    for _ in range(5):
        data = rng.standard_normal((5, 4))
        for fn in (models[0], compiled):
            fn(ndl.Tensor(data, dtype="float64")).sum().backward()
    # the second recording learns that the running mean read is the attribute itself
    assert compiled.compiled.recordings == 3 and compiled.compiled.replays == 2
    bn = [m[1] for m in models]
    np.testing.assert_allclose(bn[1].running_mean.numpy(), bn[0].running_mean.numpy(), **TOL)


def test_explain_shows_forward_and_backward_plans():
    f = ndl.compile(lambda x, w: ndl.ops.relu(x @ w + 1.0).sum())
    x, w = ndl.Tensor(np.ones((4, 8))), ndl.Tensor(np.ones((8, 8)))
    for _ in range(2):
        f(x, w)
    text = f.explain()
    assert text.index("forward (returns") < text.index("backward (run by")
    assert "scalar_gt" in text.split("backward (run by")[1]  # relu's mask, in the backward

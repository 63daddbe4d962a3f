"""The autodiff engine: topological order, gradients of gradients, graph lifetime, lazy mode."""
import gc
import importlib.util
from typing import Any, List

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import needle as ndl
from needle import Tensor
from needle.autograd import find_topo_sort
from needle.backend_cuda import emulator


def counter() -> int:
    return ndl.autograd.TENSOR_COUNTER


@pytest.fixture
def gc_off():
    """Disable the cycle collector so only reference counting can free nodes."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


# ---------------------------------------------------------------------- course checks
@pytest.mark.hw1
@pytest.mark.compute_gradient
def test_compute_gradient_of_gradient() -> None:
    """The course's check: d/dx2 of dy/dx2 for y = x2*x2 + x2*x3."""
    x2 = Tensor([6])
    x3 = Tensor([0])
    y = x2 * x2 + x2 * x3
    y.backward()
    grad_x2 = x2.grad
    grad_x3 = x3.grad
    grad_x2.backward()
    assert y.numpy() == 36
    assert grad_x2.numpy() == 2 * 6 + 0
    assert grad_x3.numpy() == 6
    assert x2.grad.numpy() == 2
    assert x3.grad.numpy() == 1


@pytest.mark.hw1
@pytest.mark.topo_sort
def test_topo_sort_course_example_1() -> None:
    a_val, b_val = 0.88282157, 0.90170084
    a1, b1 = Tensor(np.asarray([[a_val]])), Tensor(np.asarray([[b_val]]))
    # c1 = 3*a1*a1 + 4*b1*a1 - a1, built node by node so the expected order names the nodes
    t1 = 3 * a1
    t2 = t1 * a1
    t3 = 4 * b1
    t4 = t3 * a1
    t5 = t2 + t4
    t6 = -a1
    c1 = t5 + t6
    order = find_topo_sort([c1])
    assert [id(n) for n in order] == [id(n) for n in (a1, t1, t2, b1, t3, t4, t5, t6, c1)]
    expected = [a_val, 3 * a_val, 3 * a_val ** 2, b_val, 4 * b_val, 4 * a_val * b_val,
                3 * a_val ** 2 + 4 * a_val * b_val, -a_val,
                3 * a_val ** 2 + 4 * a_val * b_val - a_val]
    np.testing.assert_allclose([n.numpy().item() for n in order], expected, rtol=1e-6)
    # written with operators, the same graph sorts to the same values
    c2 = 3 * a1 * a1 + 4 * b1 * a1 - a1
    np.testing.assert_allclose([n.numpy().item() for n in find_topo_sort([c2])], expected,
                               rtol=1e-6)


@pytest.mark.hw1
@pytest.mark.topo_sort
def test_topo_sort_course_example_3() -> None:
    a = Tensor(np.asarray([[1.4335016, 0.30559972], [0.08130171, -1.15072371]]))
    b = Tensor(np.asarray([[1.34571691, -0.95584433], [-0.99428573, -0.04017499]]))
    m1 = a @ b
    s1 = m1 + b
    n = -a
    s2 = s1 + n
    e = s2 @ a  # == (a@b + b - a)@a
    assert [id(x) for x in find_topo_sort([e])] == [id(x) for x in (a, b, m1, s1, n, s2, e)]


@pytest.mark.topo_sort
def test_topo_sort_diamond() -> None:
    x = Tensor([1.0, 2.0])
    u = ndl.ops.exp(x)
    v = x * 2
    w = u + v
    assert [id(t) for t in find_topo_sort([w])] == [id(t) for t in (x, u, v, w)]
    # several roots: shared nodes appear once
    order = find_topo_sort([w, v])
    assert [id(t) for t in order] == [id(t) for t in (x, u, v, w)]


@st.composite
def random_dags(draw: Any) -> List[List[int]]:
    """inputs[i] lists the earlier nodes node i reads (1 or 2 of them)."""
    n = draw(st.integers(2, 25))
    inputs: List[List[int]] = [[]]
    for i in range(1, n):
        k = draw(st.integers(1, min(2, i)))
        inputs.append(draw(st.lists(st.integers(0, i - 1), min_size=k, max_size=k)))
    return inputs


@pytest.mark.topo_sort
@given(random_dags())
def test_topo_sort_property(inputs: List[List[int]]) -> None:
    nodes: List[Tensor] = []
    for ins in inputs:
        if not ins:
            nodes.append(Tensor([1.0]))
        elif len(ins) == 1:
            nodes.append(nodes[ins[0]] * 2)
        else:
            nodes.append(nodes[ins[0]] + nodes[ins[1]])
    order = find_topo_sort([nodes[-1]])
    pos = {id(n): i for i, n in enumerate(order)}
    assert len(pos) == len(order), "a node appears twice"
    # exactly the nodes reachable from the root
    reach, stack = set(), [len(nodes) - 1]
    while stack:
        i = stack.pop()
        if i not in reach:
            reach.add(i)
            stack.extend(inputs[i])
    assert set(pos) == {id(nodes[i]) for i in reach}
    for i in reach:
        for j in inputs[i]:
            assert pos[id(nodes[j])] < pos[id(nodes[i])]


# ---------------------------------------------------------------------- long graphs
@pytest.mark.slow
def test_backward_through_100k_node_chain() -> None:
    x = Tensor(np.array([1.0, 2.0]), dtype="float64")
    y = x
    for i in range(100_000):
        y = y * 1.0 if i % 2 else y + 1.0
    y.backward(create_graph=False)  # the default recursion limit (1000) would be hit by DFS
    np.testing.assert_array_equal(y.numpy(), [50_001.0, 50_002.0])
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])


@pytest.mark.slow
def test_lazy_realization_of_100k_node_chain(monkeypatch: Any) -> None:
    monkeypatch.setattr(ndl.autograd, "LAZY_MODE", True)
    x = Tensor(np.array([0.5]), dtype="float64", requires_grad=False)
    y = x
    for _ in range(100_000):
        y = y + 1.0
    assert y.cached_data is None
    np.testing.assert_array_equal(y.numpy(), [100_000.5])


# ---------------------------------------------------------------------- graph lifetime
def test_no_graph_kept_after_backward_without_create_graph(gc_off: None) -> None:
    base = counter()
    x = Tensor(np.random.randn(3, 4), dtype="float64")
    w = Tensor(np.random.randn(4, 2), dtype="float64")
    h = x @ w
    r = ndl.ops.relu(h)
    y = r.sum()
    assert counter() == base + 5
    y.backward(create_graph=False)
    for leaf in (x, w):
        assert leaf.grad.op is None and leaf.grad.inputs == ()
        assert not leaf.grad.requires_grad
    assert h.grad is None and r.grad is None  # intermediate nodes keep no adjoint
    assert counter() == base + 7  # 5 nodes + 2 leaf grads: no adjoint graph survives
    del y, r, h
    assert counter() == base + 4  # x, w and their grads, freed by refcounting alone
    del x, w, leaf
    assert counter() == base


def test_graph_with_create_graph_is_freed(gc_off: None) -> None:
    base = counter()
    x = Tensor(np.random.randn(3), dtype="float64")
    y = (ndl.ops.exp(x) * x).sum()
    y.backward()
    assert x.grad.op is not None  # the gradient is itself a graph (for grad of grad)
    del y
    x.grad = None
    del x
    assert counter() == base


def test_constants_and_no_grad_record_no_graph(gc_off: None) -> None:
    base = counter()
    c = Tensor(np.ones((2, 3)), requires_grad=False)
    d = (c * 2 + 1).sum()
    assert not d.requires_grad and d.op is None and d.inputs == ()
    assert counter() == base + 2  # the intermediates are already gone
    x = Tensor(np.ones((2, 3)))
    with ndl.no_grad():
        assert not ndl.is_grad_enabled()
        z = ndl.ops.exp(x * 3)
        with ndl.enable_grad():
            assert ndl.is_grad_enabled()
            q = x * 3
    assert ndl.is_grad_enabled()
    assert z.op is None and z.inputs == () and not z.requires_grad
    assert q.op is not None and q.requires_grad
    np.testing.assert_allclose(z.numpy(), np.exp(3.0) * np.ones((2, 3)), rtol=1e-6)

    @ndl.no_grad()
    def f(t: Tensor) -> Tensor:
        return t * t

    assert f(x).op is None


def test_mode_decorators_keep_metadata_and_restore_the_mode_they_found() -> None:
    x = Tensor(np.ones(3))

    @ndl.no_grad()
    def depth(n: int) -> int:
        """Recurse ``n`` times under no_grad."""
        assert not ndl.is_grad_enabled()
        return 0 if n == 0 else 1 + depth(n - 1)

    assert depth.__name__ == "depth" and depth.__doc__.startswith("Recurse")
    assert depth(3) == 3 and ndl.is_grad_enabled()

    @ndl.enable_grad()
    def square(t: Tensor) -> Tensor:
        return t * t

    with ndl.no_grad():
        assert square(x).op is not None  # the decorator enables, it does not disable
        assert not ndl.is_grad_enabled()


def test_requires_grad_propagation() -> None:
    x = Tensor([1.0, 2.0])
    c = Tensor([3.0, 4.0], requires_grad=False)
    assert x.requires_grad and not c.requires_grad
    assert (x * c).requires_grad and (c + x).requires_grad
    assert not (c * c).requires_grad


def test_backward_reaches_only_what_requires_grad() -> None:
    x = Tensor([1.0, 2.0])
    c = Tensor([3.0, 4.0], requires_grad=False)
    y = (x * c).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 4.0])
    assert c.grad is None


def test_int_and_bool_tensors_never_require_grad() -> None:
    i = Tensor(np.arange(3), dtype="int64", requires_grad=True)
    b = Tensor(np.array([True, False]), dtype="bool")
    assert i.dtype == "int64" and not i.requires_grad
    assert b.dtype == "bool" and not b.requires_grad
    assert not (i * 2).requires_grad
    f = Tensor([0, 1, 2])  # Python ints become float32 by default
    assert f.dtype == "float32" and f.requires_grad
    k = Tensor(np.arange(3))  # a NumPy array keeps its dtype (the course's hw1, torch)
    assert k.dtype == np.arange(3).dtype.name and not k.requires_grad
    nd_int = ndl.backend_ndarray.array(np.arange(3, dtype=np.int32))
    assert Tensor(nd_int).dtype == "int32" and not Tensor(nd_int).requires_grad


def test_detach_and_data() -> None:
    x = Tensor(np.array([1.0, -2.0]))
    y = x * 3
    d = y.detach()
    assert d.op is None and d.inputs == () and not d.requires_grad
    np.testing.assert_array_equal(d.numpy(), y.numpy())
    xd = x.data
    assert xd.op is None and not xd.requires_grad
    np.testing.assert_array_equal(xd.numpy(), x.numpy())
    x.data = Tensor(np.array([5.0, 6.0]))  # the course's optimizer update
    np.testing.assert_array_equal(x.numpy(), [5.0, 6.0])
    assert x.requires_grad and x.is_leaf()
    (x * x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [10.0, 12.0])


def test_backward_overwrites_leaf_grad() -> None:
    """Course semantics: each backward sets .grad, it does not accumulate across calls."""
    x = Tensor(np.array([1.0, 2.0]), dtype="float64")
    for _ in range(2):
        (x * x).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


def test_gradient_accumulates_over_uses_and_out_grad() -> None:
    x = Tensor(np.array([1.0, 2.0, 3.0]), dtype="float64")
    y = x * x + x * 3 + ndl.ops.exp(x)  # x is used four times
    g = np.array([1.0, -2.0, 0.5])
    y.backward(Tensor(g, dtype="float64"))
    a = x.numpy()
    np.testing.assert_allclose(x.grad.numpy(), g * (2 * a + 3 + np.exp(a)), rtol=1e-12)


def test_mixed_dtype_gradients_keep_each_dtype() -> None:
    x = Tensor(np.array([1.0, 2.0]), dtype="float32")
    y = Tensor(np.array([3.0, 4.0]), dtype="float64")
    z = (x * y).sum()
    assert z.dtype == "float64"
    z.backward()
    assert x.grad.dtype == "float32" and y.grad.dtype == "float64"
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 4.0])
    np.testing.assert_allclose(y.grad.numpy(), [1.0, 2.0])


def test_linear_computes_in_its_weights_dtype_whatever_float_it_is_fed() -> None:
    """A float32 model fed float64 NumPy data computes in float32 (not silently in float64);
    the gradient reaching the float64 input is float64 again. The ops promote (the course's
    hw1 matmuls float32 data with float64 weights)."""
    x_np = np.random.default_rng(0).standard_normal((5, 3))
    x64 = Tensor(x_np)  # NumPy float64 data keeps its dtype
    assert x64.dtype == "float64"
    layer = ndl.nn.Linear(3, 2)  # float32 parameters
    out = layer(x64)
    assert out.dtype == "float32" and out.shape == (5, 2)
    w, b = layer.weight.numpy(), layer.bias.numpy()
    expected = x_np.astype(np.float32) @ w + b  # what float32 arithmetic gives
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6, atol=1e-6)
    out.sum().backward()
    assert x64.grad.dtype == "float64" and layer.weight.grad.dtype == "float32"
    np.testing.assert_allclose(x64.grad.numpy(), np.tile(w.sum(1), (5, 1)), rtol=1e-6)
    assert (x64 @ Tensor(np.ones((3, 2)), dtype="float32")).dtype == "float64"  # ops promote
    conv = ndl.nn.Conv(2, 3, 3)  # float32 too
    assert conv(Tensor(np.ones((1, 2, 5, 5)))).dtype == "float32"
    # a narrower input is not cast up (bfloat16 activations under autocast keep their memory)
    half = Tensor(np.ones((5, 3)), dtype="bfloat16")
    assert layer(half).dtype == "float32" and half.dtype == "bfloat16"


def test_tensor_operators_match_numpy() -> None:
    a_np, b_np = np.random.rand(2, 3) + 0.5, np.random.rand(2, 3) + 0.5
    a, b = Tensor(a_np, dtype="float64"), Tensor(b_np, dtype="float64")
    pairs = [(a + b, a_np + b_np), (a - b, a_np - b_np), (a * b, a_np * b_np),
             (a / b, a_np / b_np), (a ** b, a_np ** b_np), (2 - a, 2 - a_np),
             (2 / a, 2 / a_np), (3 + a, 3 + a_np), (3 * a, 3 * a_np), (a - 1, a_np - 1),
             (a ** 2, a_np ** 2), (-a, -a_np), (a @ b.transpose(), a_np @ b_np.T),
             (a.sum(1), a_np.sum(1)), (a.reshape((3, 2)), a_np.reshape(3, 2)),
             (a.exp(), np.exp(a_np)), (a.log(), np.log(a_np)), (a.tanh(), np.tanh(a_np)),
             ((a - 1).relu(), np.maximum(a_np - 1, 0)), (a[1, ::-1], a_np[1, ::-1]),
             (a.broadcast_to((4, 2, 3)), np.broadcast_to(a_np, (4, 2, 3)))]
    for got, want in pairs:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    assert a.astype("float32").dtype == "float32"


# ---------------------------------------------------------------------- lazy mode
class CountingNegate(ndl.autograd.TensorOp):
    """-a, counting how often compute runs."""

    calls = 0

    def compute(self, a: Any) -> Any:
        CountingNegate.calls += 1
        return -a

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return -out_grad


def test_lazy_mode_defers_compute_until_realized(monkeypatch: Any) -> None:
    monkeypatch.setattr(ndl.autograd, "LAZY_MODE", True)
    CountingNegate.calls = 0
    x = Tensor(np.array([1.0, 2.0]))
    y = CountingNegate()(x)
    z = CountingNegate()(y) * 3
    assert CountingNegate.calls == 0
    assert y.cached_data is None and z.cached_data is None
    np.testing.assert_allclose(z.numpy(), [3.0, 6.0])
    assert CountingNegate.calls == 2 and y.cached_data is not None
    z.numpy()
    assert CountingNegate.calls == 2  # computed once, then cached


def test_lazy_mode_equals_eager(monkeypatch: Any) -> None:
    a_np, w_np = np.random.randn(3, 4), np.random.randn(4, 2)

    def run() -> List[np.ndarray]:
        a, w = Tensor(a_np, dtype="float64"), Tensor(w_np, dtype="float64")
        y = ndl.ops.logsumexp(ndl.ops.tanh(a @ w) * 2 + 1, axes=(1,))
        loss = (y * y).sum()
        loss.backward()
        return [y.numpy(), a.grad.numpy(), w.grad.numpy()]

    eager = run()
    monkeypatch.setattr(ndl.autograd, "LAZY_MODE", True)
    lazy = run()
    for e, lz in zip(eager, lazy):
        np.testing.assert_allclose(lz, e, rtol=1e-12)


# ---------------------------------------------------------------------- course API
def test_course_autograd_api() -> None:
    ag = ndl.autograd
    for name in ("Value", "Tensor", "TensorTuple", "Op", "TensorOp", "TensorTupleOp",
                 "find_topo_sort", "compute_gradient_of_variables"):
        assert hasattr(ag, name), name
    assert isinstance(ag.TENSOR_COUNTER, int) and ag.LAZY_MODE is False
    assert ndl.Tensor is ag.Tensor and issubclass(ag.Tensor, ag.Value)
    x = ndl.Tensor([1.0, 2.0], device=ndl.cpu(), dtype="float32", requires_grad=True)
    assert x.device == ndl.cpu() and x.shape == (2,) and x.dtype == "float32"
    assert x.realize_cached_data() is x.cached_data
    y = x * x
    grads = y.op.gradient_as_tuple(ndl.Tensor([1.0, 1.0]), y)
    assert isinstance(grads, tuple) and len(grads) == 2
    np.testing.assert_allclose(grads[0].numpy(), [1.0, 2.0])
    ag.compute_gradient_of_variables(y, ndl.Tensor([1.0, 1.0]))
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])
    if importlib.util.find_spec("cupy") is None:  # importing needle needs no GPU
        assert ndl.cuda().enabled() is emulator.active()  # enabled only by the emulator


def test_tensor_freed_during_interpreter_teardown_is_silent(monkeypatch):
    """At shutdown module globals become None before the last tensors die; __del__ must cope."""
    import sys
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    x = ndl.Tensor(np.ones(3))
    saved = ndl.autograd.TENSOR_COUNTER
    ndl.autograd.TENSOR_COUNTER = None  # what teardown does to the module's globals
    try:
        del x
    finally:
        ndl.autograd.TENSOR_COUNTER = saved - 1  # x is gone, uncounted while it was None
    assert unraisable == [], [u.exc_value for u in unraisable]


def test_backward_without_a_graph_raises_saying_why():
    """As PyTorch's 'element 0 of tensors does not require grad and does not have a
    grad_fn': never a silent no-op that leaves every .grad as it was."""
    x = ndl.Tensor(np.ones(3), requires_grad=False)
    with pytest.raises(RuntimeError, match="requires_grad=False"):
        (x * 2).sum().backward()
    w = ndl.Tensor(np.ones(3))
    with ndl.no_grad():
        y = (w * 2).sum()
        with pytest.raises(RuntimeError, match=r"grad mode is off"):
            y.backward()
    with pytest.raises(RuntimeError, match=r"computed under no_grad\(\)"):
        y.backward()
    with pytest.raises(RuntimeError, match="dtype int64"):
        ndl.Tensor(np.arange(3), dtype="int64").backward()
    assert w.grad is None


def test_backward_on_a_compiled_result_without_a_graph_says_so():
    w = ndl.Tensor(np.ones(3))

    def step(x):
        loss = (x * w).sum()
        loss.backward()
        return loss
    f = ndl.compile(step)
    for _ in range(3):  # recording, recording, replay: each result has no graph
        loss = f(ndl.Tensor(np.ones(3)))
        with pytest.raises(RuntimeError, match="calls backward\\(\\) itself"):
            loss.backward()

"""Gradient hooks (``register_hook``, ``register_post_accumulate_grad_hook``) and
``autograd.queue_callback``: order, replacement, removal, leaves vs non-leaves, grad of grad."""
import numpy as np
import pytest

import needle as ndl
from needle import autograd


def _leaf(values, dtype="float64"):
    return ndl.Tensor(np.asarray(values, dtype=dtype), dtype=dtype, requires_grad=True)


def test_hook_sees_incoming_gradient_and_replaces_it_on_a_leaf():
    x = _leaf([1.0, 2.0, 3.0])
    seen = []
    x.register_hook(lambda g: seen.append(g.numpy().copy()))
    x.register_hook(lambda g: g * 10)
    (x * x).sum().backward()
    np.testing.assert_allclose(seen[0], [2.0, 4.0, 6.0])
    np.testing.assert_allclose(x.grad.numpy(), [20.0, 40.0, 60.0])


def test_hooks_run_in_registration_order_each_on_the_previous_output():
    x = _leaf([1.0, 1.0])
    calls = []

    def first(g):
        calls.append(("first", g.numpy().copy()))
        return g + 1

    def second(g):
        calls.append(("second", g.numpy().copy()))
        return g * 3
    x.register_hook(first)
    x.register_hook(second)
    (x * 2).sum().backward()
    assert [c[0] for c in calls] == ["first", "second"]
    np.testing.assert_allclose(calls[1][1], [3.0, 3.0])
    np.testing.assert_allclose(x.grad.numpy(), [9.0, 9.0])


def test_hook_on_non_leaf_changes_what_flows_to_the_inputs():
    x = _leaf([1.0, -2.0])
    y = x * 3
    y.register_hook(lambda g: g * 0.5)
    (y * y).sum().backward()
    # d/dx (3x)^2 = 18 x, halved at y
    np.testing.assert_allclose(x.grad.numpy(), 9.0 * np.array([1.0, -2.0]))
    assert y.grad is None  # a hook does not make a non-leaf keep its gradient


def test_retained_non_leaf_keeps_the_hooked_gradient():
    x = _leaf([2.0])
    y = (x * 2).retain_grad()
    y.register_hook(lambda g: g * 5)
    (y * 1).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), [5.0])
    np.testing.assert_allclose(x.grad.numpy(), [10.0])


def test_tensor_used_twice_gets_one_hook_call_with_the_summed_gradient():
    x = _leaf([1.0, 2.0])
    grads, posts = [], []
    x.register_hook(lambda g: grads.append(g.numpy().copy()))
    x.register_post_accumulate_grad_hook(lambda t: posts.append(t.grad.numpy().copy()))
    y = x * 2
    (x * y + x).sum().backward()  # d/dx (2x^2 + x) = 4x + 1
    assert len(grads) == 1 and len(posts) == 1
    np.testing.assert_allclose(grads[0], [5.0, 9.0])
    np.testing.assert_allclose(posts[0], [5.0, 9.0])


def test_post_accumulate_hook_sees_final_grad_after_grad_hooks():
    w = ndl.nn.Parameter(np.array([1.0, 2.0]), dtype="float64")
    seen = []
    w.register_hook(lambda g: g * 2)
    w.register_post_accumulate_grad_hook(lambda p: seen.append((p is w, p.grad.numpy().copy())))
    (w * w).sum().backward()
    assert seen[0][0]
    np.testing.assert_allclose(seen[0][1], [4.0, 8.0])


def test_post_accumulate_hooks_fire_in_backward_order_once_per_backward():
    a, b, c = _leaf([1.0]), _leaf([2.0]), _leaf([3.0])
    order = []
    for name, t in (("a", a), ("b", b), ("c", c)):
        t.register_post_accumulate_grad_hook(lambda p, n=name: order.append(n))
    ((a * b) * c).sum().backward()
    assert sorted(order) == ["a", "b", "c"] and order[0] == "c"  # c's grad is ready first
    order.clear()
    ((a * b) * c).sum().backward()
    assert len(order) == 3


def test_post_accumulate_hook_only_on_leaves():
    x = _leaf([1.0])
    with pytest.raises(RuntimeError, match="leaf"):
        (x * 2).register_post_accumulate_grad_hook(lambda t: None)
    const = ndl.Tensor([1.0], requires_grad=False)
    with pytest.raises(RuntimeError, match="does not require"):
        const.register_hook(lambda g: g)


def test_unused_leaf_hook_is_not_called():
    x, unused = _leaf([1.0]), _leaf([1.0])
    called = []
    unused.register_post_accumulate_grad_hook(lambda t: called.append(1))
    (x * 2).sum().backward()
    assert not called


def test_remove_handle_and_fast_path_restored():
    x = _leaf([1.0, 1.0])
    h1 = x.register_hook(lambda g: g * 2)
    h2 = x.register_post_accumulate_grad_hook(lambda t: None)
    h1.remove()
    h1.remove()  # idempotent
    (x * 1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0])
    h2.remove()
    assert x._hooks is None
    with x.register_hook(lambda g: g * 4):
        (x * 1).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), [4.0, 4.0])
    (x * 1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0])


def test_hook_replacement_is_differentiable_with_create_graph():
    x = _leaf([1.0, 2.0])
    y = x ** 3
    handle = y.register_hook(lambda g: g * y)  # the replacement depends on x
    y.sum().backward(create_graph=True)
    np.testing.assert_allclose(x.grad.numpy(), 3 * np.array([1.0, 2.0]) ** 5)  # x^3 * 3x^2
    handle.remove()  # else it would fire again where the second backward passes through y
    x.grad.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 15 * np.array([1.0, 2.0]) ** 4)


def test_hook_with_wrong_shape_is_a_clear_error():
    x = _leaf([1.0, 2.0])
    x.register_hook(lambda g: g.sum())
    with pytest.raises(ValueError, match=r"expected a Tensor of shape \(2,\)"):
        (x * 1).sum().backward()


def test_queue_callback_runs_after_every_gradient_is_computed():
    a, b = _leaf([1.0]), _leaf([2.0])
    events = []

    def on_a(t):
        events.append("a")
        autograd.queue_callback(lambda: events.append(("end", b.grad is not None)))
    a.register_post_accumulate_grad_hook(on_a)
    b.register_post_accumulate_grad_hook(lambda t: events.append("b"))
    (a * b).sum().backward()
    assert events[-1] == ("end", True) and sorted(events[:2]) == ["a", "b"]
    events.clear()
    (a * b).sum().backward()  # the queue does not leak into the next backward
    assert events.count(("end", True)) == 1


def test_callback_queued_by_a_callback_runs_and_outside_backward_is_an_error():
    x = _leaf([1.0])
    events = []

    def first():
        events.append(1)
        autograd.queue_callback(lambda: events.append(2))
    x.register_hook(lambda g: autograd.queue_callback(first))
    (x * 1).sum().backward()
    assert events == [1, 2]
    with pytest.raises(RuntimeError, match="no backward pass"):
        autograd.queue_callback(lambda: None)


def test_error_in_a_hook_leaves_the_engine_usable():
    x = _leaf([1.0])

    def boom(g):
        autograd.queue_callback(lambda: None)
        raise KeyError("boom")
    h = x.register_hook(boom)
    with pytest.raises(KeyError):
        (x * 1).sum().backward()
    assert autograd._BACKWARD_CALLBACKS.queue is None
    h.remove()
    (x * 1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0])


def test_handle_does_not_keep_tensor_alive():
    import gc
    import weakref
    x = _leaf([1.0])
    handle = x.register_hook(lambda g: g)
    ref = weakref.ref(x)
    del x
    gc.collect()
    assert ref() is None
    handle.remove()  # harmless once the tensor is gone

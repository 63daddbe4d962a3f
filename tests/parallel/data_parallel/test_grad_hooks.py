"""BackwardHooks: one call per accumulated gradient, one end-of-backward call after all of them,
re-armed after a backward that raised, silent once removed."""
import numpy as np
import pytest

import needle as ndl
from needle.parallel.data_parallel.grad_hooks import BackwardHooks


def _leaf(values):
    return ndl.Tensor(np.asarray(values, dtype="float64"), dtype="float64", requires_grad=True)


def _recorder(params):
    events = []
    names = {id(p): n for n, p in params.items()}
    hooks = BackwardHooks(list(params.values()), lambda p: events.append(names[id(p)]),
                          lambda: events.append("end"))
    return hooks, events


def test_end_runs_once_per_backward_after_every_gradient():
    a, b = _leaf([1.0, 2.0]), _leaf([3.0])
    hooks, events = _recorder({"a": a, "b": b})
    (a.sum() * b.sum()).backward()
    assert sorted(events[:2]) == ["a", "b"] and events[2:] == ["end"]
    assert not hooks.queued
    (a * 3).sum().backward()  # b gets no gradient this time
    assert events[3:] == ["a", "end"]


def test_a_backward_that_raised_is_reported_once_and_the_next_one_ends_normally():
    a = _leaf([1.0, 2.0])
    calls = []

    def on_grad(p):
        calls.append("grad")
        if len(calls) == 1:
            raise RuntimeError("boom")
    hooks = BackwardHooks([a], on_grad, lambda: calls.append("end"))
    with pytest.raises(RuntimeError, match="boom"):
        (a * a).sum().backward()
    assert hooks.queued and "end" not in calls
    assert hooks.interrupted() and not hooks.interrupted()
    (a * a).sum().backward()
    assert calls == ["grad", "grad", "end"]

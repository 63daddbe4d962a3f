"""Regression: estimate_module on a model whose graph holds a TensorTuple (split, stack)."""
import numpy as np

import needle as ndl
from needle import nn
from needle.memory.estimator import estimate_module


class SplitSum(nn.Module):
    """x -> split along axis 1 -> sum of the pieces (a TensorTuple node in the graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 3)

    def forward(self, x: ndl.Tensor) -> ndl.Tensor:
        parts = ndl.ops.split(self.lin(x), axis=1)
        return parts[0] + parts[1] + parts[2]


def test_estimate_module_with_a_tensor_tuple_in_the_graph():
    """It raised AttributeError ('tuple' object has no attribute 'shape') in the liveness
    replay before _nbytes skipped tuple-valued nodes."""
    x = ndl.Tensor(np.ones((4, 6), np.float32), requires_grad=False)
    est = estimate_module(SplitSum(), [x], loss_fn=lambda out: out.sum())
    assert est["activations"] > 0 and est["backward_transient"] > 0

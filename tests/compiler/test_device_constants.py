"""``BackendDevice.constant``: a value uploaded once per key is a leaf of a compiled step from
its first call (made outside the recording), so the program is built on the second call, and a
replay uploads nothing."""
import numpy as np
import pytest
from helpers import DEVICES

import needle as ndl


@pytest.mark.parametrize("device", DEVICES)
def test_a_device_constant_made_while_recording_is_a_leaf(device):
    made = []

    def host():
        made.append(1)
        return np.arange(3.0)

    def f(x):
        c = ndl.Tensor.make_const(device.constant(("test-constant", id(made)), host, "float32"))
        return x * 2 + c

    cf = ndl.compile(f)
    x = ndl.Tensor(np.ones(3, np.float32), device=device)
    for _ in range(2):
        np.testing.assert_array_equal(cf(x).numpy(), [2.0, 3.0, 4.0])
    assert made == [1]  # uploaded once
    program = cf.program()
    assert program is not None, cf.explain()
    assert not [s for s in program.trace.steps if s.name == "from_numpy"]
    np.testing.assert_array_equal(cf(ndl.Tensor(np.zeros(3, np.float32), device=device))
                                  .numpy(), [0.0, 1.0, 2.0])

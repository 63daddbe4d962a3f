"""Graph capture: which buffers each recorded primitive reads and writes."""
import numpy as np

import needle as ndl
from needle.compiler import capture

B = capture.Buf


def test_access_of_declared_primitives():
    view = ((2, 3), (1, 2), 4)  # a transposed read starting at element 4
    assert capture.access("compact", (B(0), B(1), *view)) == ([(0, view)], 1, False)
    a_view, b_view = ((2,), (0,), 0), ((2,), (1,), 3)
    assert capture.access("ewise_strided", ("add", B(0), a_view, B(1), b_view, B(2))) == (
        [(0, a_view), (1, b_view)], 2, False)
    assert capture.access("scalar_mul", (B(5), 1.5, B(6))) == ([(5, None)], 6, False)
    assert capture.access("ewise_exp", (B(1), B(1))) == ([(1, None)], 1, False)
    assert capture.access("fill", (B(3), 0.0)) == ([], 3, False)
    # setitem and scatter-add change only part of their output: it is read as well
    assert capture.access("ewise_setitem", (B(0), B(1), *view)) == (
        [(0, None), (1, None)], 1, True)
    assert capture.access("scatter_add_rows", (B(0), B(1), B(2), 4)) == (
        [(0, None), (1, None), (2, None)], 2, True)


def test_access_of_a_fused_operation_assumes_everything():
    """A kernel that writes several buffers (layer norm: y, mean, rstd) is read and written
    whole, conservatively: the plan never reorders around it."""
    reads, write, partial = capture.access("layer_norm_fwd", tuple(map(B, range(6))) +
                                           (2, 3, 1e-5))
    assert reads == [(b, None) for b in range(6)] and write == 5 and partial


def test_recorder_records_an_ndarray_expression():
    a = ndl.NDArray(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = ndl.NDArray(np.ones(3, dtype=np.float32))
    with capture.Recorder(ndl.cpu()) as rec:
        c = a.permute((1, 0)) + 1.0
        d = a + b.broadcast_to((2, 3))
    names = [s.name for s in rec.trace.steps]
    assert "scalar_add" in names and names.count("ewise_add") + names.count(
        "ewise_strided") == 1
    np.testing.assert_array_equal(c.numpy(), np.arange(6).reshape(2, 3).T + 1)
    np.testing.assert_array_equal(d.numpy(), np.arange(6).reshape(2, 3) + 1)
    add = rec.trace.steps[-1]
    out = rec.trace.index_of(d._handle)
    assert add.write == out and rec.trace.index_of(a._handle) in [r for r, _ in add.reads]

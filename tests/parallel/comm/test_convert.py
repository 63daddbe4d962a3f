"""Collectives accept needle NDArrays and Tensors and return the same kind on the same device."""
import numpy as np
import pytest

from needle.parallel.comm.convert import to_numpy


def test_numpy_and_scalars_pass_through() -> None:
    x = np.arange(6.0).reshape(2, 3).T  # non-contiguous
    arr, restore = to_numpy(x)
    assert arr.flags.c_contiguous and np.array_equal(arr, x) and restore(arr) is arr
    assert to_numpy(3.5)[0].shape == ()
    with pytest.raises(TypeError):
        to_numpy("not an array")


def test_ndarray_round_trip() -> None:
    nd = pytest.importorskip("needle.backend_ndarray")
    if not hasattr(nd, "array"):
        pytest.skip("needle.backend_ndarray.array not written yet")
    a = nd.array(np.arange(5, dtype=np.float32), dtype="float32", device=nd.cpu())
    arr, restore = to_numpy(a)
    back = restore(arr * 2)
    assert isinstance(back, type(a)) and np.array_equal(back.numpy(), np.arange(5) * 2)


def test_tensor_round_trip() -> None:
    needle = pytest.importorskip("needle")
    if not hasattr(needle, "Tensor"):
        pytest.skip("needle.Tensor not written yet")
    t = needle.Tensor(np.ones((2, 2), dtype=np.float32), dtype="float32", requires_grad=False)
    arr, restore = to_numpy(t)
    back = restore(arr + 1)
    assert isinstance(back, needle.Tensor) and np.array_equal(back.numpy(), np.full((2, 2), 2))
    assert back.device == t.device

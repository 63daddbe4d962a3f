"""Collectives accept needle NDArrays and Tensors and return the same kind on the same device."""
import numpy as np
import pytest

from needle.parallel.comm.engine.convert import to_numpy


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


def test_host_bridge_shares_cpu_memory_and_keeps_device_and_dtype() -> None:
    """host_view / to_tensor are views on the CPU (a write shows through); to_ndarray takes
    the device and dtype of ``like``; empty_host's NumPy side is the NDArray's memory."""
    import needle
    from needle.backend_ndarray import NDArray, cpu
    from needle.parallel.comm.engine.convert import empty_host, host_view, to_ndarray, to_tensor

    t = needle.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), dtype="float32",
                      requires_grad=False)
    view = host_view(t)
    view[0, 0] = 42.0
    assert t.numpy()[0, 0] == 42.0
    arr = np.arange(4, dtype=np.float32)
    shared = to_tensor(arr, cpu())
    arr[1] = -7.0
    assert shared.numpy()[1] == -7.0 and not shared.requires_grad
    cast = to_tensor(np.arange(3, dtype=np.float32), cpu(), "float64")
    assert cast.dtype == "float64" and np.array_equal(cast.numpy(), [0, 1, 2])
    like = NDArray(np.zeros(2, dtype=np.float64), device=cpu(), dtype="float64")
    out = to_ndarray(np.arange(6.0).reshape(2, 3).T, like)  # non-contiguous in
    assert out.dtype == "float64" and out.device == like.device
    assert np.array_equal(out.numpy(), np.arange(6.0).reshape(2, 3).T)
    nd, buf = empty_host(5, np.float32)
    buf[...] = 3.0
    assert nd.shape == (5,) and np.array_equal(nd.numpy(), np.full(5, 3.0, np.float32))

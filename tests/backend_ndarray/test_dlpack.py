"""Zero-copy DLPack exchange with NumPy, PyTorch (CPU always; CUDA when a GPU is present)."""
import numpy as np
import pytest

import needle as ndl
from needle.backend_ndarray import NDArray
from needle.backend_ndarray.dlpack import from_dlpack, to_dlpack, to_torch

cuda_only = pytest.mark.skipif(not ndl.cuda().enabled(), reason="no CUDA GPU / CuPy")


def test_numpy_view_shares_memory_and_layout():
    a = NDArray(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    v = a.permute((2, 0, 1))[1:, :, ::2]
    view = to_dlpack(v)
    np.testing.assert_array_equal(view, v.numpy())
    assert np.shares_memory(view, a._handle.array)


def test_from_numpy_views_zero_copy():
    base = np.arange(20.0).reshape(4, 5)
    for src in (base[:, 1::2], base.T, base[::-1, ::2], np.zeros((0, 3))):
        got = from_dlpack(src)
        np.testing.assert_array_equal(got.numpy(), src)
    view = base[1:, ::2]
    got = from_dlpack(view)
    base[1, 0] = -7.0
    assert got.numpy()[0, 0] == -7.0


def test_torch_cpu_roundtrip_zero_copy():
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, 1:]
    a = from_dlpack(t)
    t[0, 0] = 42
    assert a.numpy()[0, 0] == 42
    back = to_torch(a)
    assert back.data_ptr() == t.data_ptr()
    b = torch.randn(6).to(torch.bfloat16)
    nb = from_dlpack(b)
    assert nb.dtype == "bfloat16"
    assert torch.equal(to_torch(nb), b)


def test_tensor_is_accepted():
    t = ndl.Tensor(np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(to_dlpack(t), np.ones((2, 2)))


@cuda_only
def test_cuda_torch_and_cupy_zero_copy():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():  # the emulator too: its cuda arrays are host memory
        pytest.skip("needs a real GPU (torch with CUDA, CuPy)")
    import cupy as cp
    t = torch.arange(30, dtype=torch.float32, device="cuda").reshape(5, 6)[1:, ::2]
    a = from_dlpack(t)
    assert a.device == ndl.cuda()
    np.testing.assert_array_equal(a.numpy(), t.cpu().numpy())
    t.mul_(2)
    np.testing.assert_array_equal(a.numpy(), t.cpu().numpy())
    back = to_torch(a.permute((1, 0)))
    assert back.data_ptr() == t.data_ptr()
    c = cp.asarray(to_dlpack(a))
    assert c.data.ptr == t.data_ptr()
    bf = torch.randn(7, device="cuda").to(torch.bfloat16)
    assert torch.equal(to_torch(from_dlpack(bf)), bf)

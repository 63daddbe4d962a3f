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


# ------------------------------------------------------------------ the DLPack protocol
def test_torch_and_numpy_consume_an_ndarray_directly_without_copy():
    torch = pytest.importorskip("torch")
    a = NDArray(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    v = a.permute((2, 0, 1))[1:, :, ::2]  # non-contiguous, offset view
    assert v.__dlpack_device__() == (1, 0)
    t = torch.from_dlpack(v)
    n = np.from_dlpack(v)
    np.testing.assert_array_equal(t.numpy(), v.numpy())
    np.testing.assert_array_equal(n, v.numpy())
    assert t.stride() == v.strides
    a[1, 0, 1] = -5.0  # the element v[0, 1, 0]: both consumers see the write
    assert t[0, 1, 0].item() == -5.0 and n[0, 1, 0] == -5.0


def test_tensor_is_a_dlpack_producer_and_keeps_float64():
    torch = pytest.importorskip("torch")
    x = ndl.Tensor(np.arange(6.0).reshape(2, 3))
    t = torch.from_dlpack(x)
    assert t.dtype == torch.float64
    np.testing.assert_array_equal(t.numpy(), np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(np.from_dlpack(x), x.numpy())


def test_bfloat16_exports_as_bfloat16():
    torch = pytest.importorskip("torch")
    src = torch.tensor([0.5, -1.25, 3.0, 7.5], dtype=torch.bfloat16)
    a = NDArray(src.float().numpy(), dtype="bfloat16")
    for view, ref in ((a, src), (a[::2], src[::2])):
        got = torch.from_dlpack(view)
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, ref)
    got = torch.from_dlpack(a.__dlpack__(max_version=(1, 0)))  # the versioned capsule
    assert got.dtype == torch.bfloat16 and torch.equal(got, src)


def test_copy_keyword():
    torch = pytest.importorskip("torch")
    a = NDArray(np.arange(6, dtype=np.float32).reshape(2, 3))
    shared = torch.from_dlpack(a.__dlpack__(copy=False))
    copied = torch.from_dlpack(a.__dlpack__(copy=True))
    shared[0, 0] = 10.0
    copied[0, 1] = 20.0
    np.testing.assert_array_equal(a.numpy()[0, :2], [10.0, 1.0])
    flipped = a[::-1]
    with pytest.raises(BufferError, match="negative strides"):
        flipped.__dlpack__(copy=False)
    np.testing.assert_array_equal(torch.from_dlpack(flipped).numpy(), flipped.numpy())


def test_stream_and_device_requests_that_cannot_be_met_raise_buffer_error():
    a = NDArray(np.ones(3, dtype=np.float32))
    with pytest.raises(BufferError, match="stream"):
        a.__dlpack__(stream=1)
    with pytest.raises(BufferError, match=r"DLPack device \(2, 0\)"):
        a.__dlpack__(dl_device=(2, 0))
    torch = pytest.importorskip("torch")
    assert torch.from_dlpack(a.__dlpack__(dl_device=(1, 0))).shape == (3,)


def test_top_level_from_dlpack_gives_a_tensor_sharing_memory():
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float64).reshape(2, 3)[:, 1:]
    x = ndl.from_dlpack(t)
    assert isinstance(x, ndl.Tensor) and x.dtype == "float64" and not x.requires_grad
    t[1, 1] = -3.0
    assert x.numpy()[1, 1] == -3.0
    y = ndl.from_dlpack(np.arange(4, dtype=np.float32), requires_grad=True)
    assert y.requires_grad
    (y * y).sum().backward()
    np.testing.assert_array_equal(y.grad.numpy(), 2 * np.arange(4, dtype=np.float32))
    z = ndl.from_dlpack(NDArray(np.arange(3, dtype=np.float32)))
    np.testing.assert_array_equal(z.numpy(), [0.0, 1.0, 2.0])


@cuda_only
def test_cuda_ndarray_protocol_with_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    a = NDArray(np.arange(12, dtype=np.float32).reshape(3, 4), device=ndl.cuda())
    assert a.__dlpack_device__() == (2, 0)
    t = torch.from_dlpack(a[:, ::2])
    assert t.is_cuda
    np.testing.assert_array_equal(t.cpu().numpy(), a.numpy()[:, ::2])


class _ClaimsCuda:
    """A producer that says its memory is on CUDA device ``index`` (kDLCUDA) but hands over a
    host capsule: under the emulator, device memory is host memory, so the CUDA import path
    (``cuda(index).wrap_dlpack``) runs without a GPU."""

    def __init__(self, arr, index: int):
        self.arr, self.index, self.dtype = arr, index, arr.dtype

    def __dlpack_device__(self):
        return 2, self.index

    def __dlpack__(self, **kwargs):
        kwargs.pop("dl_device", None)  # NumPy asks for the host, which the capsule is
        return self.arr.__dlpack__(**kwargs)


@pytest.mark.cuda
@pytest.mark.skipif(not getattr(ndl.cuda().mod, "EMULATED", False),
                    reason="needs the CUDA emulator (its device memory is host memory)")
def test_cuda_import_path_wraps_the_producers_memory_on_its_device():
    # contiguous producers only: the emulator needs a contiguous root buffer (so the span
    # offset a negative-strided producer needs is not exercised here)
    base = np.arange(20.0, dtype=np.float32).reshape(4, 5)
    index = 1 if ndl.cuda(1).enabled() else 0
    for src in (base, base[1:], base[2]):
        got = from_dlpack(_ClaimsCuda(src, index))
        assert got.device == ndl.cuda(index), got.device
        np.testing.assert_array_equal(got.numpy(), src)
    got = from_dlpack(_ClaimsCuda(base[1:], index))
    base[1, 0] = -7.0  # no copy: the NDArray sees the producer's write
    assert got.numpy()[0, 0] == -7.0
    np.testing.assert_array_equal(to_dlpack(got).get(), base[1:])  # and back, as a view

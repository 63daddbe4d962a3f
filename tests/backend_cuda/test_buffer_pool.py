"""needle's pool of freed device buffers (``needle/backend_cuda/buffer_pool.py``): a dying
Array's buffer serves the next Array of its GPU, dtype and length; exported or fully checked
buffers are never handed out again; memory figures count pooled bytes as free."""
import gc

import numpy as np
import pytest

import needle as ndl
from needle.backend_ndarray import NDArray

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not ndl.cuda().enabled(), reason="no CUDA device")]


def _buffer_address(a: NDArray) -> int:
    return a._handle.array.data.ptr


def test_a_freed_buffer_serves_the_next_array_of_its_size():
    dev = ndl.cuda()
    a = NDArray.make((1031,), device=dev, dtype="float32")
    addr = _buffer_address(a)
    del a
    gc.collect()
    b = NDArray.make((1031,), device=dev, dtype="float32")
    assert _buffer_address(b) == addr
    c = NDArray.make((1031,), device=dev, dtype="float64")  # another key: a new buffer
    assert _buffer_address(c) != addr


def test_memory_in_use_drops_when_an_array_dies_into_the_pool():
    from needle.backend_cuda import memory_stats
    dev = ndl.cuda()
    before = memory_stats(0)
    a = NDArray.make((1 << 18,), device=dev, dtype="float32")
    assert memory_stats(0)["bytes_in_use"] - before["bytes_in_use"] >= 1 << 20
    del a
    gc.collect()
    after = memory_stats(0)
    assert after["bytes_in_use"] == before["bytes_in_use"]
    assert after["bytes_free_in_pool"] >= before["bytes_free_in_pool"] + (1 << 20)


def test_an_exported_buffer_is_never_handed_out_again():
    from needle.backend_cuda.dlpack_cuda import dlpack_view
    dev = ndl.cuda()
    a = NDArray(np.arange(517, dtype=np.float32), device=dev)
    view = dlpack_view(a._handle, a.shape, a.strides, 0)  # a consumer keeps this
    addr = _buffer_address(a)
    del a
    gc.collect()
    b = NDArray(np.zeros(517, dtype=np.float32), device=dev)
    assert _buffer_address(b) != addr
    np.testing.assert_array_equal(view.get() if hasattr(view, "get") else view,
                                  np.arange(517, dtype=np.float32))


@pytest.mark.skipif(not getattr(ndl.cuda().mod, "EMULATED", False),
                    reason="the emulator's full memory check")
def test_the_full_memory_check_gets_fresh_poisoned_buffers(monkeypatch):
    monkeypatch.setenv("NEEDLE_CUDA_EMULATOR_CHECK", "full")
    dev = ndl.cuda()
    a = NDArray(np.ones(263, dtype=np.float32), device=dev)
    addr = _buffer_address(a)
    del a
    gc.collect()
    b = NDArray.make((263,), device=dev, dtype="float32")
    assert _buffer_address(b) != addr
    raw = b._handle.array.view(np.ndarray).view(np.uint8)
    assert (raw == 0xA5).all()  # poisoned, as cupy.empty's bytes are under the full check

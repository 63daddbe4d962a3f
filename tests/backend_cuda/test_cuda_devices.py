"""Several GPUs: ``ndl.cuda(i)`` allocates and computes on GPU i, arrays of two GPUs refuse to
mix, ``.to`` copies between them (two GPUs, or the emulator's, NEEDLE_CUDA_EMULATOR_DEVICES)."""
import numpy as np
import pytest

import needle as ndl
from needle.backend_cuda import emulator, memory_stats
from needle.backend_ndarray import NDArray

two_gpus = pytest.mark.skipif(not ndl.cuda(1).enabled(), reason="needs two GPUs (or "
                              "NEEDLE_CUDA_EMULATOR_DEVICES=2 with the emulator)")
pytestmark = [pytest.mark.cuda, two_gpus]
emulated = pytest.mark.skipif(not emulator.active(), reason="the emulator's own checks")


def _x(*shape):
    return np.random.randn(*shape).astype(np.float32)


def test_each_gpu_holds_its_own_buffers_and_runs_its_kernels():
    x = _x(5, 7)
    a, b = NDArray(x, device=ndl.cuda(0)), NDArray(x, device=ndl.cuda(1))
    assert a._handle.array.device.id == 0 and b._handle.array.device.id == 1
    assert repr(b.device).startswith("cuda(1")
    c = (b.permute((1, 0)).compact() * 2).sum(axis=0)
    assert c.device == ndl.cuda(1) and c._handle.array.device.id == 1
    np.testing.assert_allclose(c.numpy(), (x.T * 2).sum(axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["add", "matmul", "setitem"])
def test_arrays_on_two_gpus_refuse_to_mix_naming_both(op):
    a, b = NDArray(_x(3, 3), device=ndl.cuda(0)), NDArray(_x(3, 3), device=ndl.cuda(1))
    f = {"add": lambda: a + b, "matmul": lambda: a @ b,
         "setitem": lambda: a.__setitem__((slice(None), slice(None)), b)}[op]
    with pytest.raises(ValueError, match=r"cuda\(0.*cuda\(1"):
        f()


def test_tensors_on_two_gpus_refuse_to_mix():
    ta = ndl.Tensor(_x(2, 4), device=ndl.cuda(0))
    tb = ndl.Tensor(_x(2, 4), device=ndl.cuda(1))
    with pytest.raises(ValueError, match=r"different devices \(cuda\(0.* and cuda\(1"):
        ta + tb
    with pytest.raises(ValueError, match=r"cuda\(1.*cuda\(0"):
        ndl.ops.stack([ta, tb], 0)


def test_to_copies_between_gpus_and_gradients_stay_on_their_gpu():
    x = _x(4, 3)
    t0 = ndl.Tensor(x, device=ndl.cuda(0), requires_grad=True)
    t1 = t0.to(ndl.cuda(1))
    assert t1.device == ndl.cuda(1) and t1.cached_data._handle.array.device.id == 1
    np.testing.assert_array_equal(t1.numpy(), x)
    (t1 * t1).sum().backward()
    assert t1.grad.device == ndl.cuda(1)
    np.testing.assert_allclose(t1.grad.numpy(), 2 * x, rtol=1e-6)
    back = NDArray(x, device=ndl.cuda(1)).to(ndl.cuda(0))
    assert back._handle.array.device.id == 0
    np.testing.assert_array_equal(back.numpy(), x)


def test_memory_is_counted_per_gpu():
    before0, before1 = memory_stats(0)["bytes_in_use"], memory_stats(1)["bytes_in_use"]
    a = ndl.cuda(1).empty((1 << 18,), dtype="float32")
    assert memory_stats(1)["bytes_in_use"] - before1 >= 1 << 20
    assert memory_stats(0)["bytes_in_use"] - before0 < 1 << 20
    del a


@emulated
def test_emulator_refuses_a_buffer_of_another_device_like_a_gpu_would():
    cp = emulator.cupy_module()
    with cp.cuda.Device(1):
        on1 = cp.asarray(np.arange(4.0))
    assert on1.device.id == 1 and on1.data.device_id == 1
    with cp.cuda.Device(0), pytest.raises(ValueError, match="array device = 1 while current "
                                                            "= 0"):
        cp.add(on1, 1.0)
    with cp.cuda.Device(1):
        np.testing.assert_array_equal(cp.add(on1, 1.0).get(), np.arange(4.0) + 1)
    with pytest.raises(RuntimeError, match="invalid device ordinal 9"):
        cp.cuda.Device(9)


@emulated
def test_device_count_variable_is_checked(monkeypatch):
    from needle.backend_cuda.emulator import fake_cupy
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(fake_cupy.DEVICES_ENV, bad)
        with pytest.raises(ValueError, match=f"NEEDLE_CUDA_EMULATOR_DEVICES='{bad}'"):
            fake_cupy.cuda.runtime.getDeviceCount()
    monkeypatch.setenv(fake_cupy.DEVICES_ENV, "3")
    assert fake_cupy.cuda.runtime.getDeviceCount() == 3


def test_fused_ops_run_on_the_second_gpu():
    from needle.backend_ndarray import fused_ops as F
    x = _x(6, 9)
    a = NDArray(x, device=ndl.cuda(1))
    w, b = NDArray(np.ones(9, np.float32), device=ndl.cuda(1)), NDArray(
        np.zeros(9, np.float32), device=ndl.cuda(1))
    sm = F.softmax(a)
    y = F.layer_norm(a, w, b)[0]
    assert sm.device == y.device == ndl.cuda(1)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(sm.numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    z = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y.numpy(), z, rtol=1e-4, atol=1e-4)


def test_compiled_elementwise_kernel_reduces_on_the_second_gpu():
    """needle.compile's fused primitive with a reduction: its scratch buffer on out's GPU."""
    x = _x(4, 5)
    a = NDArray(x, device=ndl.cuda(1))
    out = NDArray(np.zeros(4, np.float32), device=ndl.cuda(1))
    ndl.cuda(1).fused_elementwise("out = x0 * c0", [(a._handle, (4, 5), (5, 1), 0),
                                                    np.float32(2.0)], out._handle, (4, 5),
                                  reduce=("sum", 5, 1))
    np.testing.assert_allclose(out.numpy(), (2 * x).sum(1), rtol=1e-5)

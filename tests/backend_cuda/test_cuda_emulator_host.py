"""The emulator's host side: the NEEDLE_CUDA_EMULATOR switch, the CuPy stand-in's checks and
memory pool, its ElementwiseKernel, and DLPack of emulated cuda arrays (host capsules)."""
import os

import numpy as np
import pytest

import needle as ndl
from needle.backend_cuda import emulator
from needle.backend_cuda.fused_elementwise_cuda import kernel_parts
from needle.backend_ndarray import NDArray

emulated = pytest.mark.skipif(not emulator.active(), reason="needs NEEDLE_CUDA_EMULATOR=1 "
                              "without a GPU (tests/conftest.py sets it)")


@pytest.mark.parametrize("value,want", [("", "off"), ("0", "off"), ("1", "on"), ("yes", "on"),
                                        ("force", "force"), (" FORCE ", "force")])
def test_setting_reads_the_variable(monkeypatch, value, want):
    monkeypatch.setenv(emulator.ENV, value)
    assert emulator.setting() == want


def test_bad_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv(emulator.ENV, "gpu")
    with pytest.raises(ValueError, match="NEEDLE_CUDA_EMULATOR='gpu'"):
        emulator.setting()


def test_switch_refuses_unknown_modules_and_serves_real_cupy_when_off(monkeypatch):
    with pytest.raises(ValueError, match="cupyx.scipy"):
        emulator.cupy_module("cupyx.scipy")
    monkeypatch.setattr(emulator, "active", lambda: False)
    try:
        mod = emulator.cupy_module("cupy")
    except ImportError:  # no CuPy here: exactly what makes ndl.cuda() disabled
        return
    assert mod.__name__ == "cupy"


def test_emulator_without_a_compiler_stays_off_and_says_why(monkeypatch):
    from needle.backend_cuda.emulator import build

    def no_compiler():
        raise build.EmulatorUnavailable("the CUDA emulator needs a C++ compiler: 'g++' not found")
    monkeypatch.setenv(emulator.ENV, "force")
    monkeypatch.setattr(build, "compiler", no_compiler)
    emulator.unavailable_reason.cache_clear()
    emulator.active.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="cannot run here: .*'g\\+\\+' not found"):
            assert emulator.active() is False
    finally:
        monkeypatch.undo()
        emulator.unavailable_reason.cache_clear()
        emulator.active.cache_clear()


def test_kernel_parts_use_numpy_dtype_names():
    """CuPy reads 'float x' as float64 and refuses it: parameters must be dtype names."""
    ins, out, body = kernel_parts("out = x0 * c0", [np.float32, np.float64], 1, np.bool_)
    assert ins == "float32 x0, float64 c0" and out == "bool out" and body == "out = (x0 * c0);"


# ---------------------------------------------------------------------- emulated only
@emulated
def test_cuda_device_says_it_is_emulated():
    assert ndl.cuda().enabled() and repr(ndl.cuda()) == "cuda(0, emulated)"
    count = int(os.environ.get("NEEDLE_CUDA_EMULATOR_DEVICES", "1"))
    assert ndl.cuda() == ndl.cuda(0) and ndl.cuda(count - 1).enabled()
    assert not ndl.cuda(count).enabled()


@emulated
def test_host_arrays_are_refused_where_device_arrays_go():
    cp = emulator.cupy_module()
    a = cp.asarray(np.arange(4.0))
    with pytest.raises(TypeError, match="host array"):
        cp.add(a, np.ones(4))
    with pytest.raises(TypeError, match="host array"):
        cp.copyto(a, np.ones(4))
    with pytest.raises(TypeError, match="Only numpy.ndarray"):
        a.set(a)
    with pytest.raises(TypeError, match="float32 array cannot be set to float64"):
        a.set(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="Shape mismatch"):
        a.set(np.ones(5))
    np.testing.assert_array_equal(cp.add(a, 1.0).get(), np.arange(4.0) + 1)


@emulated
def test_memory_pool_counts_live_buffers_not_views():
    cp = emulator.cupy_module()
    pool = cp.get_default_memory_pool()
    before = pool.used_bytes()
    a = cp.empty((1000,), np.float64)
    assert pool.used_bytes() - before == 8000
    view = a[::2].reshape(50, 10)
    b = cp.multiply(view, 2.0)  # a new buffer: counted
    assert pool.used_bytes() - before == 8000 + 4000
    del a, b
    assert pool.used_bytes() - before == 8000  # the view keeps a's buffer alive
    del view
    assert pool.used_bytes() == before


@emulated
@pytest.mark.cuda
def test_memory_stats_follow_ndarrays():
    before = ndl.backend_cuda.memory_stats(0)["bytes_in_use"]
    a = NDArray(np.ones((256, 256), np.float32), device=ndl.cuda())
    assert ndl.backend_cuda.memory_stats(0)["bytes_in_use"] - before >= 256 * 256 * 4
    del a
    assert ndl.backend_cuda.memory_stats(0)["bytes_in_use"] == before


@emulated
@pytest.mark.cuda
def test_elementwise_kernel_on_strided_and_broadcast_views():
    cp = emulator.cupy_module()
    k = cp.ElementwiseKernel("float64 x, float64 y, float32 c", "float64 z",
                             "z = x * y + c", "axpy")
    x = np.random.randn(4, 6, 5)
    y = np.random.randn(8, 1)
    gx = cp.asarray(x)[:, ::-2, 1:4].transpose(2, 0, 1)  # (3, 4, 3), negative strides
    gy = cp.asarray(y)[::2]  # (4, 1): broadcast over the first and last axes
    out = cp.empty((3, 4, 3), np.float64)
    k(gx, gy, 0.5, out)
    want = x[:, ::-2, 1:4].transpose(2, 0, 1) * y[::2] + np.float32(0.5)
    np.testing.assert_allclose(out.get(), want, rtol=1e-15)
    scalar_out = cp.empty((), np.float64)
    k(cp.asarray(np.array(2.0)), cp.asarray(np.array(3.0)), 1.0, scalar_out)
    assert scalar_out.get() == 7.0


@emulated
def test_elementwise_kernel_keeps_cupys_checks():
    cp = emulator.cupy_module()
    with pytest.raises(ValueError, match="Wrong type float"):
        cp.ElementwiseKernel("float x", "float y", "y = x", "copy")
    k = cp.ElementwiseKernel("float32 x", "float32 y", "y = x", "copy")
    with pytest.raises(TypeError, match="Type is mismatched"):
        k(cp.empty(3, np.float64), cp.empty(3, np.float32))
    with pytest.raises(ValueError, match="Out shape is mismatched"):
        k(cp.empty((3, 4), np.float32), cp.empty(4, np.float32))  # out must not broadcast
    with pytest.raises(TypeError, match="Unsupported type"):
        k(np.ones(3, np.float32), cp.empty(3, np.float32))


@emulated
@pytest.mark.cuda
def test_dlpack_of_an_emulated_cuda_array_is_a_host_capsule():
    """Emulated device memory is host memory: consumers get kDLCPU views, not copies."""
    from needle.backend_ndarray import dlpack
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = NDArray(x, device=ndl.cuda())
    view = dlpack.to_dlpack(a.permute((1, 0))[1:])
    assert view.__dlpack_device__() == (1, 0)  # kDLCPU
    host = np.from_dlpack(view)
    np.testing.assert_array_equal(host, x.T[1:])
    host[0, 0] = -1.0  # shares the cuda array's memory
    assert a.numpy()[0, 1] == -1.0
    torch = pytest.importorskip("torch")
    t = dlpack.to_torch(a)
    assert t.device.type == "cpu" and t.data_ptr() == a._handle.ptr()
    back = dlpack.from_dlpack(t)
    assert back.device == ndl.cpu()  # a kDLCPU producer lands on the CPU device
    np.testing.assert_array_equal(back.numpy(), a.numpy())
    assert torch.equal(t, torch.from_numpy(a.numpy()))

"""The emulator's memory checker (cuda_emu_check.h, memcheck.py) on planted bugs.

Each bug is planted in a copy of a real kernel (the mutation site is asserted to exist) or in a
few-line test kernel. The checker must name the kernel, block, thread, buffer, index and the
source line, and the process must go on working (the bad write never happened). Expected
lines are found by searching the mutated source, not copied from the checker.
"""
import numpy as np
import pytest

from needle.backend_cuda import kernel_specs as K
from needle.backend_cuda.emulator import fake_cupy as cp
from needle.backend_cuda.emulator.module import (
    EmulatorKernelError,
    EmulatorMemoryError,
    load_module,
)

OPTIONS = K.NVRTC_OPTIONS + K.include_options()
COMPACT_LOOP = ("  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride())\n"
                "    out[i] = a[")
REDUCE_BARRIER = "    if (lane == 0) smem[warp] = acc;\n    __syncthreads();\n"
TEST_KERNELS = r"""
// Threads 0..31 fill s; every thread of the block reads its own slot.
__global__ void half_filled(float* out) {
  __shared__ float s[64];
  if (threadIdx.x < 32) s[threadIdx.x] = 1.0f + threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}
// Reads one element past a __shared__ array.
__global__ void shared_overrun(float* out, int k) {
  __shared__ float t[32];
  t[threadIdx.x] = (float)threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = t[threadIdx.x + k];
}
// out[blockIdx.x] = the rank of this block in the order blocks ran.
__global__ void block_rank(int* counter, int* out) {
  if (threadIdx.x == 0) out[blockIdx.x] = atomicAdd(counter, 1);
}
"""


def line_of(code: str, text: str, path: str) -> str:
    """``path:N`` of the one line of ``code`` containing ``text``."""
    hits = [i + 1 for i, line in enumerate(code.splitlines()) if text in line]
    assert len(hits) == 1, f"{text!r} is on lines {hits}"
    return f"{path}:{hits[0]}"


def mutated(filename: str, old: str, new: str) -> str:
    src = K.source(filename)
    assert src.count(old) == 1, f"the mutation site moved in {filename}"
    return src.replace(old, new)


def test_out_of_bounds_write_in_compact_is_named_and_the_process_survives(tmp_path):
    path = str(tmp_path / "strided.cu")
    code = mutated("strided.cu", COMPACT_LOOP, COMPACT_LOOP.replace("i < n", "i <= n"))
    name = K.strided_name("compact", 4)
    k = load_module(code, [name], OPTIONS, filename=path).get_function(name)
    n = 60
    base = cp.asarray(np.arange(n, dtype=np.uint32))
    meta = cp.asarray(np.array(K.view_meta((3, 4, 5), (1, 3, 12), 0), np.int64))
    out = cp.asarray(np.zeros(n, np.uint32))
    with pytest.raises(EmulatorMemoryError) as err:
        k((1,), (128,), (base, out, meta, np.int64(n)))
    msg = str(err.value)
    assert "kernel 'compact<unsigned int>'" in msg and "block (0, 0, 0)" in msg
    assert f"thread ({n}, 0, 0)" in msg and "out-of-bounds write of 4 bytes" in msg
    assert f"argument 1 'out' (uint32, {4 * n} bytes) at index {n}" in msg
    assert line_of(code, "    out[i] = a[", path) in msg
    # the write never happened: the heap is intact and the correct kernel still runs
    good = load_module(K.source("strided.cu"), [name], OPTIONS).get_function(name)
    good((1,), (128,), (base, out, meta, np.int64(n)))
    want = np.arange(n, dtype=np.uint32).reshape(5, 4, 3).transpose(2, 1, 0).ravel()
    np.testing.assert_array_equal(out.get(), want)


@pytest.mark.parametrize("engine", ["fiber", "threads"])
def test_shared_overrun_is_caught_on_both_engines(engine):
    k = load_module(TEST_KERNELS, ["shared_overrun"], engine=engine,
                    filename="memcheck_kernels.cu").get_function("shared_overrun")
    out = cp.asarray(np.zeros(32, np.float32))
    k((1,), (32,), (out, np.int32(0)))
    np.testing.assert_array_equal(out.get(), np.arange(32, dtype=np.float32))
    with pytest.raises(EmulatorMemoryError) as err:
        k((1,), (32,), (out, np.int32(1)))
    msg = str(err.value)
    assert "thread (31, 0, 0)" in msg and "out-of-bounds read of 4 bytes" in msg
    assert "__shared__ t (in shared_overrun) at index 32 (128 bytes)" in msg
    assert line_of(TEST_KERNELS, "t[threadIdx.x + k]", "memcheck_kernels.cu") in msg


def test_bounds_mode_needs_known_bounds_for_bare_addresses():
    """A bare int address has no known extent: the checker lets accesses outside every known
    buffer through rather than guess (the kernel tests pass arrays)."""
    k = load_module(TEST_KERNELS, ["half_filled"],
                    filename="memcheck_kernels.cu").get_function("half_filled")
    out = np.zeros(64, np.float32)
    k((1,), (64,), (out.ctypes.data,))
    assert out[:32].tolist() == [1.0 + i for i in range(32)]


@pytest.mark.parametrize("engine", ["fiber", "threads"])
def test_full_mode_reports_a_missing_syncthreads_as_a_race(monkeypatch, tmp_path, engine):
    """On either engine, whichever of the write and the read comes first."""
    monkeypatch.setenv("NEEDLE_CUDA_EMULATOR_CHECK", "full")
    path = str(tmp_path / "reduce.cu")
    code = mutated("reduce.cu", REDUCE_BARRIER, "    if (lane == 0) smem[warp] = acc;\n")
    name = K.reduce_name("block", "sum", "float32", "float32")
    k = load_module(code, [name], OPTIONS, filename=path, engine=engine).get_function(name)
    a = cp.asarray(np.random.default_rng(0).random((4, 300)).astype(np.float32))
    out = cp.asarray(np.zeros(4, np.float32))
    with pytest.raises(EmulatorMemoryError) as err:
        k((2, 1), (256,), (a, out, np.int64(4), np.int64(300), np.int64(300)))
    msg = str(err.value)
    assert "shared-memory race" in msg and "__shared__ smem (in reduce_rows_block)" in msg
    assert line_of(code, "if (lane == 0) smem[warp] = acc;", path) in msg
    assert line_of(code, "acc = (lane < nwarps) ? smem[lane]", path) in msg
    assert "no __syncthreads() between" in msg
    # the unmutated kernel is clean under the same checks
    good = load_module(K.source("reduce.cu"), [name], OPTIONS, engine=engine).get_function(name)
    good((2, 1), (256,), (a, out, np.int64(4), np.int64(300), np.int64(300)))
    np.testing.assert_allclose(out.get(), a.get().sum(1), rtol=1e-5)


@pytest.mark.parametrize("engine", ["fiber", "threads"])
def test_full_mode_reports_an_uninitialised_shared_read(monkeypatch, engine):
    k = load_module(TEST_KERNELS, ["half_filled"], engine=engine,
                    filename="memcheck_kernels.cu").get_function("half_filled")
    out = cp.asarray(np.zeros(64, np.float32))
    k((1,), (64,), (out,))  # bounds mode: every access is in bounds
    monkeypatch.setenv("NEEDLE_CUDA_EMULATOR_CHECK", "full")
    k = load_module(TEST_KERNELS, ["half_filled"], engine=engine,
                    filename="memcheck_kernels.cu").get_function("half_filled")
    k((1,), (32,), (out,))  # 32 threads: every slot read was written
    with pytest.raises(EmulatorMemoryError) as err:
        k((1,), (64,), (out,))
    msg = str(err.value)
    assert "read of uninitialised __shared__ s (in half_filled)[" in msg
    assert line_of(TEST_KERNELS, "out[threadIdx.x] = s[threadIdx.x];",
                   "memcheck_kernels.cu") in msg


def test_full_mode_runs_blocks_in_a_seeded_order(monkeypatch):
    def ranks(level: str, seed: str) -> list:
        monkeypatch.setenv("NEEDLE_CUDA_EMULATOR_CHECK", level)
        monkeypatch.setenv("NEEDLE_CUDA_EMULATOR_SEED", seed)
        k = load_module(TEST_KERNELS, ["block_rank"],
                        filename="memcheck_kernels.cu").get_function("block_rank")
        counter, out = cp.asarray(np.zeros(1, np.int32)), cp.asarray(np.zeros(40, np.int32))
        k((40,), (32,), (counter, out))
        return out.get().tolist()
    assert ranks("bounds", "0") == list(range(40))
    shuffled = ranks("full", "1")
    assert sorted(shuffled) == list(range(40)) and shuffled != list(range(40))
    assert ranks("full", "1") == shuffled and ranks("full", "2") != shuffled


def test_check_level_is_validated(monkeypatch):
    monkeypatch.setenv("NEEDLE_CUDA_EMULATOR_CHECK", "yes")
    with pytest.raises(ValueError, match="NEEDLE_CUDA_EMULATOR_CHECK='yes'"):
        load_module(TEST_KERNELS, ["half_filled"])


def test_off_mode_builds_without_checks(monkeypatch):
    """The unchecked build still runs kernels (for timing); it reports no memory errors."""
    monkeypatch.setenv("NEEDLE_CUDA_EMULATOR_CHECK", "off")
    k = load_module(TEST_KERNELS, ["half_filled"],
                    filename="memcheck_kernels.cu").get_function("half_filled")
    out = cp.asarray(np.zeros(32, np.float32))
    k((1,), (32,), (out,))
    assert out.get().tolist() == [1.0 + i for i in range(32)]
    assert issubclass(EmulatorMemoryError, EmulatorKernelError)


def test_full_mode_reports_a_read_of_device_memory_nothing_wrote(monkeypatch):
    """cupy.empty's bytes are poisoned and tracked: a kernel reading elements no kernel and not
    the host wrote is an error; elements the host or a kernel wrote are fine."""
    monkeypatch.setenv("NEEDLE_CUDA_EMULATOR_CHECK", "full")
    name = K.unary_name("exp", "float32")
    k = load_module(K.named_source("ewise.cu"), K.name_expressions("ewise.cu", "float32"),
                    OPTIONS).get_function(name)
    n = 100
    out = cp.empty(n, np.float32)
    src = cp.asarray(np.linspace(0, 1, n, dtype=np.float32))  # written by the host
    k((1,), (128,), (src, out, np.int64(n)))
    k((1,), (128,), (out, src, np.int64(n)))  # reads what the first launch wrote
    np.testing.assert_allclose(src.get(), np.exp(np.exp(np.linspace(0, 1, n))), rtol=1e-5)
    half = cp.empty(n, np.float32)
    k((1,), (128,), (src, half, np.int64(n // 2)))  # writes only the first half
    with pytest.raises(EmulatorMemoryError) as err:
        k((1,), (128,), (half, out, np.int64(n)))
    msg = str(err.value)
    assert "read of uninitialised device memory: argument 0 'a' (float32, 400 bytes)" in msg
    assert f"at index {n // 2}" in msg and "ewise.cu:" in msg

"""The emulator enforces CUDA's rules: strict barriers, warp masks, launch limits, argument types.

Each broken kernel below is small and written here; the error must name the kernel and the line.
Both engines (fibers and one OS thread per CUDA thread) are checked, and none may hang.
"""
import numpy as np
import pytest
from emu_helpers import ptr

from needle.backend_cuda.emulator.module import (
    EmulatorKernelError,
    EmulatorLaunchError,
    load_module,
)

ENGINES = ["fiber", "threads"]


def one_kernel(body: str, params: str = "float* out", engine: str = "fiber", name: str = "k"):
    """Build ``extern "C" __global__ void name(params) { body }`` and return the kernel."""
    code = f'extern "C" __global__ void {name}({params}) {{\n{body}\n}}\n'
    return load_module(code, [name], engine=engine).get_function(name)


def line_of(kernel_body: str, text: str) -> int:
    """1-based source line of ``text`` (the body starts on line 2)."""
    return 2 + [i for i, ln in enumerate(kernel_body.splitlines()) if text in ln][0]


# ---------------------------------------------------------------------- strict barriers
DIVERGENT = {
    "barrier in a branch": ("if (threadIdx.x < 16) __syncthreads();\nout[threadIdx.x] = 1;",
                            "__syncthreads", "divergent barrier"),
    "two barrier lines": ("if (threadIdx.x % 2) { __syncthreads(); }\n"
                          "else { out[0] = 0; __syncthreads(); }", "else", "while"),
    "return before barrier": ("if (threadIdx.x == 3) return;\n__syncthreads();\n"
                              "out[threadIdx.x] = 1;", "__syncthreads", "returned"),
    "shuffle vs barrier deadlock": ("float v = threadIdx.x;\n"
                                    "if (threadIdx.x != 5) v = __shfl_down_sync(0xffffffffu, v, 1);"
                                    "\n__syncthreads();\nout[threadIdx.x] = v;", "__shfl_down_sync",
                                    "deadlock"),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", sorted(DIVERGENT))
def test_divergent_barriers_fail_naming_kernel_and_line(engine, case):
    body, text, words = DIVERGENT[case]
    name = "broken_" + case.replace(" ", "_")
    k = one_kernel(body, engine=engine, name=name)
    out = np.zeros(64, np.float32)
    with pytest.raises(EmulatorKernelError) as err:
        k((2,), (32,), (ptr(out),))
    msg = str(err.value)
    assert f"kernel '{name}'" in msg and words in msg, msg
    assert f":{line_of(body, text)}" in msg, msg


def test_barrier_reached_by_all_threads_passes():
    body = ("__shared__ float s[64];\ns[threadIdx.x] = threadIdx.x + 100 * blockIdx.x;\n"
            "__syncthreads();\nout[blockIdx.x * 64 + threadIdx.x] = s[63 - threadIdx.x];")
    for engine in ENGINES:
        out = np.zeros(3 * 64, np.float32)
        one_kernel(body, engine=engine, name="reverse")((3,), (64,), (ptr(out),))
        want = (63 - np.arange(64))[None, :] + 100 * np.arange(3)[:, None]
        np.testing.assert_array_equal(out, want.ravel())


def test_shared_memory_is_per_block_and_seen_by_the_whole_block():
    """Each block's threads see the value their own block stored, never another block's."""
    body = ("__shared__ int tag;\nif (threadIdx.x == 0) tag = blockIdx.x + 1;\n"
            "__syncthreads();\nout[blockIdx.x * blockDim.x + threadIdx.x] = tag;\n"
            "__syncthreads();")
    out = np.zeros(5 * 40, np.int32)
    one_kernel(body, "int* out", name="tags")((5,), (40,), (ptr(out),))
    np.testing.assert_array_equal(out.reshape(5, 40), np.repeat(np.arange(1, 6), 40)
                                  .reshape(5, 40))


def test_dynamic_shared_memory():
    body = ("extern __shared__ float buf[];\nbuf[threadIdx.x] = threadIdx.x * 2;\n"
            "__syncthreads();\nout[threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];")
    out = np.zeros(48, np.float32)
    one_kernel(body, name="dyn")((1,), (48,), (ptr(out),), shared_mem=48 * 4)
    np.testing.assert_array_equal(out, (47 - np.arange(48)) * 2)


# ---------------------------------------------------------------------- warp operations
@pytest.mark.parametrize("engine", ENGINES)
def test_shuffles_and_votes_match_their_definitions(engine):
    body = ("const int lane = threadIdx.x & 31; const int b = blockIdx.x * 32 + lane;\n"
            "int v = 100 + threadIdx.x;\n"
            "out[0 * 64 + threadIdx.x] = __shfl_down_sync(0xffffffffu, v, 3);\n"
            "out[1 * 64 + threadIdx.x] = __shfl_up_sync(0xffffffffu, v, 2, 16);\n"
            "out[2 * 64 + threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 5);\n"
            "out[3 * 64 + threadIdx.x] = __shfl_sync(0xffffffffu, v, 7, 8);\n"
            "out[4 * 64 + threadIdx.x] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);\n"
            "out[5 * 64 + threadIdx.x] = __any_sync(0xffffffffu, lane == 31) + "
            "2 * __all_sync(0xffffffffu, lane < 31);\n(void)b;")
    out = np.zeros(6 * 64, np.int32)
    one_kernel(body, "int* out", engine=engine, name="warp_ops")((1,), (64,), (ptr(out),))
    t = np.arange(64)
    lane, base = t % 32, t - t % 32
    v = 100 + t
    down = np.where(lane + 3 < 32, v + 3, v)
    up = np.where(lane % 16 >= 2, v - 2, v)
    xor = 100 + base + (lane ^ 5)
    idx = 100 + base + (lane // 8) * 8 + 7
    ballot = sum(1 << i for i in range(0, 32, 3))
    ballot = ballot - (1 << 32) if ballot >= 1 << 31 else ballot
    want = np.concatenate([down, up, xor, idx, np.full(64, ballot), np.full(64, 1)])
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("engine", ENGINES)
def test_shuffle_in_a_partial_warp_fails(engine):
    k = one_kernel("out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1);", engine=engine,
                   name="partial_warp")
    out = np.zeros(48, np.float32)
    with pytest.raises(EmulatorKernelError, match="names lanes missing from warp 1"):
        k((1,), (48,), (ptr(out),))  # lanes 48..63 of warp 1 do not exist


def test_shuffle_with_a_lane_that_returned_fails():
    body = ("if (threadIdx.x == 31) return;\n"
            "out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.f, 1);")
    with pytest.raises(EmulatorKernelError, match="lane"):
        one_kernel(body, name="lane_gone")((1,), (32,), (ptr(np.zeros(32, np.float32)),))


# ---------------------------------------------------------------------- launch limits
BAD_LAUNCHES = {
    "1536 threads": ((1,), (512, 3), 0, "1536 threads"),
    "block z 65": ((1,), (1, 1, 65), 0, "blockDim.z = 65"),
    "block x 2048": ((1,), (2048, 1), 0, "blockDim.x = 2048"),
    "grid y 65536": ((1, 65536), (32,), 0, "gridDim.y = 65536"),
    "grid z 65536": ((1, 1, 65536), (32,), 0, "gridDim.z = 65536"),
    "grid x 2^31": ((2 ** 31,), (32,), 0, "gridDim.x = 2147483648"),
    "zero grid": ((0,), (32,), 0, ">= 1"),
    "zero block": ((1,), (0,), 0, ">= 1"),
    "dynamic shared": ((1,), (32,), 48 * 1024 + 1, "exceed 49152"),
}


@pytest.mark.parametrize("case", sorted(BAD_LAUNCHES))
def test_launch_limits(case):
    grid, block, shared, words = BAD_LAUNCHES[case]
    k = one_kernel("out[0] = 1;", name="tiny")
    with pytest.raises(EmulatorLaunchError) as err:
        k(grid, block, (ptr(np.zeros(1, np.float32)),), shared_mem=shared)
    assert err.value.status == "CUDA_ERROR_INVALID_VALUE"
    assert "kernel 'tiny'" in str(err.value) and words in str(err.value), str(err.value)


def test_static_shared_memory_limit_counts_static_and_dynamic():
    big = one_kernel("__shared__ float s[12289];\ns[threadIdx.x] = 1; out[0] = s[0];",
                     name="too_much_shared")  # 49156 bytes
    assert big.static_shared_bytes >= 12289 * 4
    with pytest.raises(EmulatorLaunchError, match="too_much_shared.*49156 bytes of static"):
        big((1,), (32,), (ptr(np.zeros(1, np.float32)),))
    ok = one_kernel("__shared__ float s[8192];\ns[threadIdx.x] = 1; out[0] = s[0];",
                    name="half_shared")  # 32 KiB static: fine alone, not with 20 KiB dynamic
    ok((1,), (32,), (ptr(np.zeros(1, np.float32)),))
    with pytest.raises(EmulatorLaunchError, match="dynamic shared"):
        ok((1,), (32,), (ptr(np.zeros(1, np.float32)),), shared_mem=20 * 1024)


def test_full_limits_are_allowed():
    k = one_kernel("if (threadIdx.x + threadIdx.y + threadIdx.z == 0) out[blockIdx.y] = 1;",
                   name="limits_ok")
    out = np.zeros(3, np.float32)
    k((1, 3), (16, 8, 8), (ptr(out),))  # 1024 threads, z = 8
    np.testing.assert_array_equal(out, 1)


# ---------------------------------------------------------------------- argument types
ARG_CASES = {
    "int32 for long long": ("long long n", np.int32(3), "got int32"),
    "float64 for float": ("float x", np.float64(1.5), "got float64"),
    "python float for float": ("float x", 1.5, "Python float"),
    "python int for int": ("int n", 3, "Python int"),
    "float32 for int": ("int n", np.float32(3), "got float32"),
    "array for scalar": ("int n", np.zeros(2, np.int32), "got ndarray"),
}


@pytest.mark.parametrize("case", sorted(ARG_CASES))
def test_argument_a_gpu_would_misread_is_an_error(case):
    param, value, words = ARG_CASES[case]
    k = one_kernel("out[0] = 1;", f"float* out, {param}", name="typed")
    with pytest.raises(TypeError) as err:
        k((1,), (1,), (ptr(np.zeros(1, np.float32)), value))
    assert "kernel 'typed': argument 1" in str(err.value) and words in str(err.value), \
        str(err.value)


def test_arguments_cupy_passes_correctly_are_converted():
    body = "out[0] = (double)n + x + (double)y + (flag ? 1000.0 : 0.0) + (double)(float)h;"
    k = one_kernel(body, "double* out, long long n, double x, float y, bool flag, __half h",
                   name="converted")
    out = np.zeros(1, np.float64)
    k((1,), (1,), (ptr(out), 7, 0.25, np.float32(0.5), True, np.float16(2.0)))
    assert out[0] == 7 + 0.25 + 0.5 + 1000 + 2
    assert k.param_types == ["p", "i8", "f8", "f4", "?", "f2"]
    with pytest.raises(TypeError, match="takes 6 arguments"):
        k((1,), (1,), (ptr(out), 7))


def test_two_modules_keep_their_own_builtins():
    """Two libraries loaded together must not share threadIdx/blockIdx (-fno-gnu-unique)."""
    a = one_kernel("out[blockIdx.x * blockDim.x + threadIdx.x] = threadIdx.x;", name="mod_a")
    b = one_kernel("out[blockIdx.x * blockDim.x + threadIdx.x] = blockIdx.x;", name="mod_b")
    oa, ob = np.zeros(96, np.float32), np.zeros(96, np.float32)
    for _ in range(2):
        a((3,), (32,), (ptr(oa),))
        b((3,), (32,), (ptr(ob),))
    np.testing.assert_array_equal(oa, np.tile(np.arange(32), 3))
    np.testing.assert_array_equal(ob, np.repeat(np.arange(3), 32))


@pytest.mark.parametrize("engine", ENGINES)
def test_atomics_and_syncwarp(engine):
    body = ("atomicAdd(&out_f[0], 0.5f);\natomicAdd(&out_i[0], 1);\n"
            "atomicMax(&out_i[1], (int)(blockIdx.x * blockDim.x + threadIdx.x));\n"
            "__shared__ int s[64];\ns[threadIdx.x] = threadIdx.x;\n__syncwarp();\n"
            "out_i[2 + blockIdx.x * 64 + threadIdx.x] = s[threadIdx.x ^ 1];")
    k = one_kernel(body, "float* out_f, int* out_i", engine=engine, name="atomics")
    out_f, out_i = np.zeros(1, np.float32), np.zeros(2 + 3 * 64, np.int32)
    k((3,), (64,), (ptr(out_f), ptr(out_i)))
    assert out_f[0] == 0.5 * 192 and out_i[0] == 192 and out_i[1] == 191
    np.testing.assert_array_equal(out_i[2:], np.tile(np.arange(64) ^ 1, 3))

"""Every CUDA kernel compiles through NVRTC on a machine with no GPU (CI's check on kernels)."""
import pytest

from needle.backend_cuda import compile_check, kernel_specs

if compile_check.find_nvrtc() is None:  # a missing compiler must not pass silently
    raise ImportError("libnvrtc not found: pip install nvidia-cuda-nvrtc-cu12 "
                      "nvidia-cuda-runtime-cu12 (in the [dev] extras)")


@pytest.mark.parametrize("filename", kernel_specs.KERNEL_FILES)
def test_kernel_file_compiles(filename):
    ptx = compile_check.compile_kernel_file(filename)
    assert ".entry" in ptx  # at least one kernel was emitted


def test_half_and_bfloat16_instantiations_are_compiled():
    ptx = compile_check.compile_kernel_file("softmax.cu")
    # mangled names carry the element type: __half -> 6__half, __nv_bfloat16 -> 13__nv_bfloat16
    assert "6__half" in ptx and "13__nv_bfloat16" in ptx and "softmax_rows" in ptx


def test_syntax_error_fails():
    bad = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f }'  # missing ';'
    with pytest.raises(compile_check.NVRTCError, match="expected a \";\""):
        compile_check.compile_source(bad, "bad.cu")


def test_type_error_in_half_instantiation_fails():
    src = ('#include "common.cuh"\n'
           'template <typename T> __global__ void k(T* x) { x[0] = x[0].not_a_member; }\n')
    compile_check.compile_source(src.replace("x[0].not_a_member", "x[0]"), "ok.cu", ["k<float>"])
    with pytest.raises(compile_check.NVRTCError):
        compile_check.compile_source(src, "bad.cu", ["k<__half>"])


@pytest.mark.slow
def test_main_prints_every_file(capsys):
    assert compile_check.main([]) == 0
    out = capsys.readouterr().out
    assert all(f in out for f in kernel_specs.KERNEL_FILES)

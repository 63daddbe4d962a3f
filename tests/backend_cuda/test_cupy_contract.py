"""needle's contract with real CuPy (13 or 14, cupy-cuda12x or cupy-cuda13x), checked without a GPU.

Runs wherever CuPy imports (it installs nothing): every CuPy name the backend uses exists and
takes the backend's call; every name the emulator's stand-in (``fake_cupy``) offers exists in
CuPy and accepts every call the stand-in accepts, so code that runs on the emulator runs on
CuPy; each kernel file compiles through CuPy's own NVRTC program (the one ``RawModule`` uses)
to sm_90 machine code with every template instantiation the backend asks for.
"""
import numpy as np
import pytest
from cupy_surface import (
    backend_uses,
    incompatibilities,
    real_name,
    resolve,
    signature_of,
    stand_in_surface,
)

from needle.backend_cuda import kernel_specs as K
from needle.backend_cuda.emulator import fake_cupy
from needle.backend_ndarray import primitives

cupy = pytest.importorskip("cupy", reason="CuPy is not installed (pip install cupy-cuda12x)")

USES = list(backend_uses())
SURFACE = stand_in_surface(fake_cupy)
# Stand-in constructors the backend never calls (CuPy builds these objects itself: a kernel
# comes from RawModule.get_function, a pointer from ndarray.data), so their arguments differ.
BUILT_BY_CUPY = {"RawKernel", "MemoryPointer", "cuda.Graph"}
OPERATORS = ("__add__", "__enter__", "__exit__")  # Cython writes these as (x, y): no names
# Attributes the backend reads off CuPy objects (the ones NumPy's ndarray gives the stand-in
# for free are here too: the stand-in's ndarray is a NumPy subclass).
ATTRIBUTES = {"ndarray": ("data", "device", "get", "set", "reshape", "transpose", "fill",
                          "astype", "view", "nbytes", "itemsize", "dtype", "size", "shape",
                          "strides", "sum", "max", "__dlpack__", "__getitem__",
                          "__setitem__"),
              "cuda.Device": ("id", "attributes", "compute_capability", "use", "__enter__",
                              "__exit__"),
              "cuda.MemoryPointer": ("ptr", "mem", "device_id", "__add__")}
DEVICE_ATTRIBUTES = ("MultiProcessorCount",)  # keys of Device.attributes the backend reads


def _real(name: str):
    try:
        return resolve(name)
    except ImportError as e:  # cuBLAS's module loads libcublas, absent without the CUDA libs
        pytest.skip(f"{name} cannot be imported here: {e}")
    except AttributeError:
        pytest.fail(f"{name} does not exist in CuPy {cupy.__version__}")


def test_the_scan_sees_the_backend():
    names = {u.name for u in USES}
    assert {"cupy.RawModule", "cupy.cuda.Device", "cupy.ndarray", "cupy.from_dlpack",
            "cupy_backends.cuda.libs.cublas.gemmStridedBatchedEx"} <= names
    assert {"RawModule.get_function", "ndarray.get", "cuda.Device", "copyto"} <= set(SURFACE)


@pytest.mark.parametrize("use", USES, ids=lambda u: f"{u.name}@{u.where}")
def test_backend_call_exists_with_its_signature(use):
    obj = _real(use.name)
    sig = signature_of(obj)
    if use.npos is None or sig is None:  # a reference, not a call; or a ufunc (no signature)
        assert callable(obj) or obj is not None
        return
    try:
        sig.bind(*range(use.npos), **dict.fromkeys(use.keywords))
    except TypeError as e:
        pytest.fail(f"{use.where}: {use.name}{sig} does not take {use.npos} positional "
                    f"arguments and keywords {use.keywords}: {e}")


@pytest.mark.parametrize("path", sorted(SURFACE))
def test_stand_in_name_exists_in_cupy_with_a_compatible_signature(path):
    real = _real(real_name(path))
    if (path in BUILT_BY_CUPY or path.endswith(OPERATORS)
            or path in getattr(fake_cupy, "_NUMPY_FUNCTIONS", ())):
        return  # existence only: see BUILT_BY_CUPY; NumPy's functions are CuPy's superset
    fake_sig, real_sig = signature_of(SURFACE[path]), signature_of(real)
    if fake_sig is None or real_sig is None:
        assert isinstance(SURFACE[path], property) or real_sig is None, path
        return
    why = incompatibilities(fake_sig, real_sig)
    assert not why, (f"fake_cupy.{path}{fake_sig} vs {real_name(path)}{real_sig}: "
                     + "; ".join(why))


def test_each_elementwise_ops_ufunc_exists_in_cupy():
    """The backend calls ``getattr(cupy, ufunc)`` for each row of the elementwise table (a name
    the scan above cannot see), and the stand-in offers it."""
    for _, ufunc, _ in primitives.ELEMENTWISE:
        assert callable(getattr(cupy, ufunc, None)), f"cupy.{ufunc} is missing"
        assert getattr(fake_cupy, ufunc) is getattr(np, ufunc), ufunc


def _fake_instances():
    array = fake_cupy.empty((2,), "float32")
    return {"ndarray": array, "cuda.Device": fake_cupy.cuda.Device(0), "cuda.MemoryPointer":
            array.data + 4}


@pytest.mark.parametrize("owner", sorted(ATTRIBUTES))
def test_attributes_the_backend_reads_exist_on_both(owner):
    real = _real(real_name(owner))
    fake = _fake_instances()[owner]
    for attr in ATTRIBUTES[owner]:
        assert hasattr(real, attr), f"{real_name(owner)}.{attr} is missing in CuPy"
        assert hasattr(fake, attr), f"fake_cupy's {owner}.{attr} is missing"


def test_device_attribute_names_are_cudas():
    """Device.attributes keys are CUDA's cudaDevAttr names without the prefix."""
    runtime = cupy.cuda.runtime
    for key in DEVICE_ATTRIBUTES:
        assert hasattr(runtime, "cudaDevAttr" + key), key
        assert key in fake_cupy.Device(0).attributes


def _nvrtc_options():
    import ctypes

    from needle.backend_cuda.compile_check import find_cuda_include, find_nvrtc
    if find_nvrtc():  # CuPy 13 dlopens libnvrtc by name: the pip wheel's, loaded first, serves
        ctypes.CDLL(find_nvrtc(), mode=ctypes.RTLD_GLOBAL)
    options = K.NVRTC_OPTIONS + K.include_options()
    core = pytest.importorskip("cupy._core.core")
    assemble = getattr(core, "assemble_cupy_compiler_options", None)
    if assemble is not None:  # what RawModule adds: CuPy's and the CUDA runtime's headers
        options = tuple(assemble(options))
    inc = find_cuda_include()  # CuPy 13 leaves the CUDA headers to the toolkit's path
    return options + (("-I" + inc,) if inc and "-I" + inc not in options else ())


@pytest.mark.slow
@pytest.mark.parametrize("filename", K.KERNEL_FILES)
def test_kernel_compiles_through_cupys_nvrtc(filename):
    """NVRTC as RawModule drives it (CuPy's program class, its options), to sm_90 cubin."""
    from cupy.cuda import compiler
    names = K.name_expressions(filename)
    try:
        options = _nvrtc_options() + ("-arch=sm_90", "--device-as-default-execution-space")
        prog = compiler._NVRTCProgram(K.source(filename), filename, name_expressions=names,
                                      method="cubin")
        binary, mapping = prog.compile(options)
    except compiler.CompileException as e:
        pytest.fail(f"{filename} does not compile through CuPy's NVRTC: {e}")
    except (OSError, RuntimeError) as e:  # no NVRTC library here: an environment fact
        if "nvrtc" not in str(e).lower():
            raise
        pytest.skip(f"CuPy cannot load NVRTC here: {e}")
    assert binary[:4] == b"\x7fELF", "NVRTC did not return a cubin"
    assert set(mapping) == set(names) and all(mapping.values())


def test_raw_module_and_elementwise_kernel_take_the_backends_arguments():
    """Constructing them compiles nothing (that waits for a device), so it works here."""
    src = K.source("ewise.cu")
    cupy.RawModule(code=src, options=K.NVRTC_OPTIONS + K.include_options(),
                   name_expressions=K.name_expressions("ewise.cu", "float32"))
    from needle.backend_cuda.fused_elementwise_cuda import kernel_parts
    cupy.ElementwiseKernel(*kernel_parts("out = x0 * c0", ["float32", "float32"], 1,
                                         "float32"), "needle_fused")

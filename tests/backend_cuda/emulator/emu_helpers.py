"""Helpers for the CUDA emulator's kernel-level tests (modules built once, disk-cached)."""
import functools

import ml_dtypes
import numpy as np

from needle.backend_cuda import kernel_specs as K

NP_DTYPE = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16),
            "float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}


@functools.lru_cache(maxsize=None)
def kernel_module(filename: str, dtype: str = ""):
    """The emulated module of ``kernels/<filename>`` for one dtype, as the backend builds it."""
    from needle.backend_cuda.emulator.module import load_module
    return load_module(K.named_source(filename), K.name_expressions(filename, dtype),
                       K.NVRTC_OPTIONS + K.include_options())


def kernel(filename: str, name: str, dtype: str = ""):
    """One kernel (a name expression) of ``kernels/<filename>``."""
    return kernel_module(filename, dtype).get_function(name)


def ptr(a: np.ndarray):
    """``a`` as the emulator's device array: a pointer parameter receives its first element's
    address, and the memory checker knows the allocation's bounds."""
    from needle.backend_cuda.emulator import fake_cupy
    return a.view(fake_cupy.ndarray)

"""needle's CUDA backend on CuPy: kernels in ``kernels/*.cu``, primitives, fused ops.

DLPack exchange (zero-copy with CuPy, NumPy and PyTorch) is ``needle.backend_ndarray.dlpack``.

Importing this package does not import CuPy; ``ndarray_backend_cuda`` (loaded by
``ndl.cuda()``) does. Helpers that need CuPy import it when called. Without a GPU,
``NEEDLE_CUDA_EMULATOR=1`` runs all of it on the CPU (``emulator/``, README "CUDA without a GPU").
"""
from typing import Any, Dict


def memory_stats(device_index: int = 0) -> Dict[str, int]:
    """Bytes in use, reserved and peak in CuPy's memory pool on GPU ``device_index``."""
    from .ndarray_backend_cuda import memory_stats as stats
    return stats(device_index)


def reset_peak_memory(device_index: int = 0) -> None:
    """Restart peak tracking on GPU ``device_index`` from the bytes in use now."""
    from .ndarray_backend_cuda import reset_peak_memory as reset
    reset(device_index)

"""needle's CUDA backend on CuPy: kernels in ``kernels/*.cu``, primitives, fused ops.

DLPack exchange (zero-copy with CuPy, NumPy and PyTorch) is ``needle.backend_ndarray.dlpack``;
its CUDA half (``dlpack_cuda``) is offered as device primitives, so the array layer never
imports this package.

Importing this package registers the ``"cuda"`` device kind with ``needle.backend_ndarray``
(``ndl.cuda(i)`` looks it up there) and does not import CuPy: ``ndarray_backend_cuda``, loaded
by the first ``ndl.cuda()``, does. Helpers that need CuPy import it when called. Without a GPU,
``NEEDLE_CUDA_EMULATOR=1`` runs all of it on the CPU (``emulator/``, README "CUDA without a GPU").
"""
from typing import Any, Dict, Optional

from ..backend_ndarray.device import register_device_kind


def _backend_for(index: int) -> Optional[Any]:
    """The primitives bound to GPU ``index``, or None where CuPy or that GPU is missing."""
    try:
        from .ndarray_backend_cuda import available, for_device
    except Exception:  # CuPy missing or broken: the device exists but is disabled
        return None
    return for_device(index) if available(index) else None  # allocates on GPU index


register_device_kind("cuda", _backend_for)


def memory_stats(device_index: int = 0) -> Dict[str, int]:
    """Bytes in use, reserved and peak in CuPy's memory pool on GPU ``device_index``."""
    from .ndarray_backend_cuda import memory_stats as stats
    return stats(device_index)


def reset_peak_memory(device_index: int = 0) -> None:
    """Restart peak tracking on GPU ``device_index`` from the bytes in use now."""
    from .ndarray_backend_cuda import reset_peak_memory as reset
    reset(device_index)

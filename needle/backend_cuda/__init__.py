"""needle's CUDA backend on CuPy. Importing it registers the ``"cuda"`` device kind; the first
``ndl.cuda()`` imports CuPy. ``NEEDLE_CUDA_EMULATOR=1`` runs it without a GPU (README)."""
from typing import Any, Dict, Optional

from ..backend_ndarray.device import register_device_kind


def _backend_for(index: int) -> Optional[Any]:
    """The primitives bound to GPU ``index``, or None where CuPy or that GPU is missing."""
    try:
        from .ndarray_backend_cuda import available, for_device
    except ValueError:  # a setting the user wrote (NEEDLE_CUDA_REDUCE=slow): not "no GPU"
        raise
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

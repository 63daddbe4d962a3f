"""DLPack's CUDA half, offered as device primitives (``dlpack_view``, ``wrap_dlpack``) so the
array layer never imports this package."""
from typing import Any, Tuple

import numpy as np

from ..backend_ndarray.dlpack import buffer_span, element_strides
from ._runtime import BF16, cp


def dlpack_view(handle: Any, shape: Tuple[int, ...], strides: Tuple[int, ...],
                offset: int) -> Any:
    """A zero-copy CuPy view of the strided view (shape, strides, offset in items) of a buffer."""
    item = handle.array.itemsize
    handle.known_range = None  # the consumer may write it: its values are no longer known
    handle.pooled = False  # and may outlive it: its memory must not be handed out again
    mem = handle.array.data + offset * item
    return cp.ndarray(shape, dtype=handle.array.dtype, memptr=mem,
                      strides=tuple(s * item for s in strides))


def wrap_dlpack(obj: Any, bfloat16: bool, index: int, array_cls: Any
                ) -> Tuple[Any, tuple, tuple, int]:
    """(buffer, shape, strides, offset) over a CUDA DLPack producer's memory on GPU ``index``,
    the buffer an ``array_cls`` (the backend's ``Array``) made around it.

    ``bfloat16``: ``obj`` holds bfloat16 as its 16-bit integer bits (DLPack consumers such as
    CuPy have no bfloat16); the buffer gets ml_dtypes' bfloat16 as its dtype.
    """
    view = cp.from_dlpack(obj)
    if bfloat16:
        view = view.view(np.uint16)
    strides = element_strides(view)
    offset, size = buffer_span(view.shape, strides)
    arr: Any = object.__new__(array_cls)
    item = view.dtype.itemsize
    # MemoryPointer + (-n), as CuPy's own __sub__ does (the emulator's pointer has only __add__)
    base = view.data + (-offset * item) if size else view.data
    arr.array = cp.ndarray((size,), dtype=view.dtype, memptr=base)
    arr.size, arr.dtype, arr.device_index = size, (BF16 if bfloat16 else view.dtype), index
    return arr, view.shape, strides, offset

"""Zero-copy exchange of NDArrays with CuPy, NumPy (CPU side) and PyTorch through DLPack.

``to_dlpack(a)`` returns a CuPy (cuda) or NumPy (cpu) *view* of the NDArray's memory, which
any DLPack consumer takes without a copy: ``torch.from_dlpack(to_dlpack(a))``.
``from_dlpack(obj)`` wraps any producer's memory (``__dlpack__``) as an NDArray. bfloat16
travels as its uint16 bits through NumPy (which has no bfloat16 in DLPack); ``to_torch``
reinterprets them.
"""
from typing import Any, Optional

import numpy as np

_CPU, _CUDA = 1, 2  # DLDeviceType codes


def _ndarray(a: Any) -> Any:
    return a.cached_data if hasattr(a, "cached_data") else a  # a Tensor's NDArray


def to_dlpack(a: Any) -> Any:
    """A zero-copy CuPy/NumPy view (shape, strides, offset kept) of an NDArray or Tensor."""
    a = _ndarray(a)
    if any(s < 0 for s in a.strides):
        a = a.compact()  # consumers (torch) reject negative strides: the one case that copies
    handle, item = a._handle, a._handle.array.itemsize
    if a.device.name == "cuda":
        from needle.backend_cuda._runtime import cp  # CuPy or the emulator's
        mem = handle.array.data + a.offset * item
        view = cp.ndarray(a.shape, dtype=handle.array.dtype, memptr=mem,
                          strides=tuple(s * item for s in a.strides))
        return view
    base = handle.array
    if a.dtype == "bfloat16":  # NumPy cannot export ml_dtypes' bfloat16: hand over the bits
        base = base.view(np.uint16)
    return np.lib.stride_tricks.as_strided(base[a.offset:], shape=a.shape,
                                           strides=tuple(s * item for s in a.strides))


def to_torch(a: Any) -> Any:
    """A torch tensor sharing the NDArray's memory (bfloat16 included)."""
    import torch
    a = _ndarray(a)
    t = torch.from_dlpack(to_dlpack(a))
    return t.view(torch.bfloat16) if a.dtype == "bfloat16" else t


def from_dlpack(obj: Any, device: Optional[Any] = None) -> Any:
    """An NDArray over a DLPack producer's memory (no copy); ``device`` defaults to the source."""
    from .device import cpu, cuda
    from .ndarray import NDArray
    dev_type, dev_id = obj.__dlpack_device__()
    is_bf16 = str(getattr(obj, "dtype", "")).endswith("bfloat16")
    if is_bf16 and hasattr(obj, "view"):  # a torch bfloat16 tensor: move its bits as int16
        import torch
        obj = obj.view(torch.int16)
    if dev_type == _CUDA:
        from needle.backend_cuda._runtime import cp
        view = cp.from_dlpack(obj)
        target = cuda(dev_id)
        if is_bf16:
            view = view.view(np.uint16)
        wrapped = _wrap_cuda(view, _bf16() if is_bf16 else view.dtype, dev_id)
    elif dev_type == _CPU:
        view = np.from_dlpack(obj)
        if is_bf16:
            view = view.view(_bf16())
        target = cpu()
        wrapped = _wrap_cpu(view)
    else:
        raise ValueError(f"from_dlpack: unsupported DLPack device type {dev_type}")
    handle, shape, strides, offset = wrapped
    out = NDArray.make(shape, strides=strides, device=target, handle=handle, offset=offset)
    return out if device is None or device == target else out.to(device)


def _bf16() -> np.dtype:
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


def _span(shape: tuple, strides: tuple) -> tuple:
    """(offset, size) in elements of the smallest buffer covering a strided view."""
    lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0 and n > 0)
    hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0 and n > 0)
    return -lo, (hi - lo + 1) if all(shape) else 0


def _elem_strides(x: Any) -> tuple:
    item = x.dtype.itemsize
    if any(s % item for s in x.strides):
        raise ValueError(f"from_dlpack: strides {x.strides} are not multiples of the item size")
    return tuple(s // item for s in x.strides)


def _wrap_cuda(view: Any, dtype: np.dtype, dev_id: int) -> tuple:
    from needle.backend_cuda._runtime import cp
    from needle.backend_cuda.ndarray_backend_cuda import for_device
    strides = _elem_strides(view)
    offset, size = _span(view.shape, strides)
    arr = object.__new__(for_device(dev_id).Array)
    item = view.dtype.itemsize
    base = view.data - offset * item if size else view.data
    arr.array = cp.ndarray((size,), dtype=view.dtype, memptr=base)
    arr.size, arr.dtype, arr.device_index = size, np.dtype(dtype), dev_id
    return arr, view.shape, strides, offset


def _wrap_cpu(view: np.ndarray) -> tuple:
    from .ndarray_backend_numpy import Array
    strides = _elem_strides(view)
    offset, size = _span(view.shape, strides)
    arr = object.__new__(Array)
    arr.array = _flat_cpu(view, offset, size)
    if "dtype" in Array.__slots__:  # plain attributes in the NumPy backend's Array
        arr.size, arr.dtype = size, arr.array.dtype
    return arr, view.shape, strides, offset


def _flat_cpu(view: np.ndarray, offset: int, size: int) -> np.ndarray:
    """A 1-D numpy array of ``size`` items starting ``offset`` items before ``view``'s first."""
    item = view.itemsize
    addr = view.__array_interface__["data"][0] - offset * item
    if size == 0:
        return np.empty(0, dtype=view.dtype)
    iface = {"data": (addr, False), "shape": (size * item,), "typestr": "|u1", "version": 3}
    holder = type("_Buf", (), {"__array_interface__": iface, "_keep": view})()
    return np.asarray(holder).view(view.dtype)  # via bytes: works for bfloat16 and bool too

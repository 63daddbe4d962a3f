"""Zero-copy exchange of NDArrays with CuPy, NumPy and PyTorch through DLPack (docs/dtypes.md).
bfloat16 travels as uint16 bits, marked kDLBfloat again by ``export``."""
import ctypes
from typing import Any, Optional, Tuple

import numpy as np

from .dtypes import bfloat16

_CPU, _CUDA = 1, 2  # DLDeviceType codes


def _ndarray(a: Any) -> Any:
    return a.cached_data if hasattr(a, "cached_data") else a  # a Tensor's NDArray


def to_dlpack(a: Any) -> Any:
    """A zero-copy CuPy/NumPy view (shape, strides, offset kept) of an NDArray or Tensor."""
    a = _ndarray(a)
    if any(s < 0 for s in a.strides):
        a = a.compact()  # consumers (torch) reject negative strides: the one case that copies
    handle, item = a._handle, a._handle.array.itemsize
    if a.device.name == "cuda":  # the CUDA backend's primitive: a CuPy (or emulator) view
        return a.device.dlpack_view(handle, a.shape, a.strides, a.offset)
    base = handle.array
    if a.dtype == "bfloat16":  # NumPy cannot export ml_dtypes' bfloat16: hand over the bits
        base = base.view(np.uint16)
    return np.lib.stride_tricks.as_strided(base[a.offset:], shape=a.shape,
                                           strides=tuple(s * item for s in a.strides))


def device_of(a: Any) -> Tuple[int, int]:
    """``__dlpack_device__``: (DLDeviceType, device id) of an NDArray."""
    dev = _ndarray(a).device
    if dev.name == "cuda":
        return _CUDA, dev.index
    if dev.name.startswith("cpu"):
        return _CPU, 0
    raise BufferError(f"__dlpack_device__: device {dev!r} has no DLPack device type")


def export(a: Any, stream: Any = None, max_version: Optional[Tuple[int, int]] = None,
           dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any:
    """``__dlpack__``: a DLPack capsule over ``a``'s memory (the Python array API protocol).

    ``copy=False`` never copies (BufferError where the layout needs one: negative strides);
    ``copy=True`` always does; ``dl_device`` other than ``a``'s own raises BufferError;
    ``stream`` must be None on the CPU and is passed to CuPy on CUDA.
    """
    a = _ndarray(a)
    own = device_of(a)
    if dl_device is not None and tuple(dl_device) != own:
        raise BufferError(f"__dlpack__: cannot export an array on {a.device!r} (DLPack device "
                          f"{own}) to DLPack device {tuple(dl_device)}")
    if own[0] == _CPU and stream is not None:
        raise BufferError(f"__dlpack__: stream must be None for a CPU array, got {stream!r}")
    if copy is False and any(s < 0 for s in a.strides):
        raise BufferError("__dlpack__: negative strides cannot be exported without a copy "
                          "(DLPack consumers such as torch reject them); pass copy=None/True")
    if copy:
        from .ndarray import NDArray
        a = NDArray(a)  # a fresh compact copy, same dtype and device
    kwargs = {} if max_version is None else {"max_version": tuple(max_version)}
    if own[0] == _CUDA:
        kwargs["stream"] = stream
    view = to_dlpack(a)
    try:
        capsule = view.__dlpack__(**kwargs)
    except TypeError:  # an older producer without max_version: the legacy capsule is allowed
        kwargs.pop("max_version", None)
        capsule = view.__dlpack__(**kwargs)
    if a.dtype == "bfloat16":
        _mark_bfloat16(capsule)
    return capsule


class _DLTensorHead(ctypes.Structure):
    """The start of DLPack's DLTensor, up to its dtype (dlpack.h)."""

    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


_KDL_BFLOAT = 4
# Offset of dl_tensor in DLManagedTensorVersioned: version (2 x uint32), manager_ctx, deleter,
# flags (uint64); in the unversioned DLManagedTensor it comes first.
_VERSIONED_OFFSET = 8 + 2 * ctypes.sizeof(ctypes.c_void_p) + 8


def _mark_bfloat16(capsule: Any) -> None:
    """Retype an exported uint16 capsule as bfloat16 (NumPy cannot export ml_dtypes' type)."""
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    name = api.PyCapsule_GetName(capsule)
    ptr = api.PyCapsule_GetPointer(capsule, name)
    head = _DLTensorHead.from_address(ptr + (_VERSIONED_OFFSET if name.endswith(b"versioned")
                                             else 0))
    if (head.code, head.bits, head.lanes) != (1, 16, 1):  # kDLUInt, 16 bits
        raise BufferError(f"__dlpack__: expected the uint16 bits of a bfloat16 array, got "
                          f"type code {head.code} with {head.bits} bits")
    head.code = _KDL_BFLOAT


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
    if not hasattr(obj, "__dlpack_device__"):
        raise TypeError(f"from_dlpack: {type(obj).__name__} is not a DLPack producer (no "
                        "__dlpack_device__)")
    dev_type, dev_id = obj.__dlpack_device__()
    is_bf16 = str(getattr(obj, "dtype", "")).endswith("bfloat16")
    if is_bf16 and hasattr(obj, "view"):  # a torch bfloat16 tensor: move its bits as int16
        import torch
        obj = obj.view(torch.int16)
    if dev_type == _CUDA:
        target = cuda(dev_id)  # the CUDA backend's primitive reads the producer's memory
        wrapped = target.wrap_dlpack(obj, is_bf16, dev_id)
    elif dev_type == _CPU:
        view = np.from_dlpack(obj)
        if is_bf16:
            view = view.view(bfloat16)
        target = cpu()
        wrapped = _wrap_cpu(view)
    else:
        raise ValueError(f"from_dlpack: unsupported DLPack device type {dev_type}")
    handle, shape, strides, offset = wrapped
    out = NDArray.make(shape, strides=strides, device=target, handle=handle, offset=offset)
    return out if device is None or device == target else out.to(device)


def buffer_span(shape: tuple, strides: tuple) -> tuple:
    """(offset, size) in elements of the smallest buffer covering a strided view."""
    lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0 and n > 0)
    hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0 and n > 0)
    return -lo, (hi - lo + 1) if all(shape) else 0


def element_strides(x: Any) -> tuple:
    """A producer array's strides in items (its ``strides`` are in bytes)."""
    item = x.dtype.itemsize
    if any(s % item for s in x.strides):
        raise ValueError(f"from_dlpack: strides {x.strides} are not multiples of the item size")
    return tuple(s // item for s in x.strides)


def _wrap_cpu(view: np.ndarray) -> tuple:
    from .ndarray_backend_numpy import Array
    strides = element_strides(view)
    offset, size = buffer_span(view.shape, strides)
    arr = object.__new__(Array)
    arr.array = _flat_cpu(view, offset, size)
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

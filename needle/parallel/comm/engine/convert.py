"""Moving collective inputs and outputs between numpy, needle NDArrays and needle Tensors.

MPI sends raw host memory, so every input becomes a C-contiguous numpy array first.  A CUDA
NDArray or Tensor is staged through the host (``.numpy()``), and the result goes back to the
input's device (each rank's own GPU: ``needle.parallel.devices``): the MPI wheel is not
CUDA-aware. ``host_view``, ``to_tensor``, ``to_ndarray`` and ``empty_host`` are the host bridge
every strategy uses (data parallel, ZeRO/FSDP, the parameter server, the TP and MoE comms).
"""
from typing import Any, Callable, Optional, Tuple

import numpy as np

from ....autograd import Tensor
from ....backend_ndarray import NDArray, array, cpu, dlpack
from ....backend_ndarray.dtypes import to_numpy_dtype

__all__ = ["same", "to_numpy", "host_view", "to_tensor", "to_ndarray", "empty_host"]

Restore = Callable[[np.ndarray], Any]


def to_numpy(a: Any) -> Tuple[np.ndarray, Restore]:
    """A C-contiguous numpy view or copy of ``a``, and a function turning results back into
    ``a``'s kind (and device)."""
    if type(a) is np.ndarray and a.flags.c_contiguous:  # the common case, first
        return a, same
    if isinstance(a, (np.ndarray, np.generic, int, float, bool)):
        return _contiguous(np.asarray(a)), same
    if isinstance(a, (Tensor, NDArray)):
        device, tensor = a.device, isinstance(a, Tensor)

        def restore(x: np.ndarray) -> Any:
            if tensor:
                return Tensor(x, device=device, dtype=x.dtype.name, requires_grad=False)
            return array(x, dtype=x.dtype.name, device=device)
        return _contiguous(a.numpy()), restore
    raise TypeError(f"collectives take numpy arrays, needle NDArrays or Tensors, not {type(a)}")


def same(x: Any) -> Any:
    """``x`` itself (a numpy input's results stay numpy arrays)."""
    return x


def _contiguous(x: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
    return x if x.flags.c_contiguous else x.copy(order="C")


def host_view(x: Any) -> np.ndarray:
    """The data of a Tensor/NDArray as NumPy: a view on the CPU (no copy), else a copy."""
    a = x.realize_cached_data() if isinstance(x, Tensor) else x
    if a.device.name == "cpu" and a.dtype != "bfloat16":
        return dlpack.to_dlpack(a)
    return a.numpy()


def to_tensor(arr: np.ndarray, device: Any = None, dtype: Optional[str] = None) -> Tensor:
    """A constant Tensor over ``arr``: shares its memory on the CPU, copied to other devices."""
    device = cpu() if device is None else device
    if dtype is not None and to_numpy_dtype(dtype) != arr.dtype:
        arr = arr.astype(to_numpy_dtype(dtype))
    if device.name == "cpu" and arr.dtype.name != "bfloat16":
        return Tensor.make_const(dlpack.from_dlpack(arr))
    return Tensor.make_const(NDArray(arr, device=device, dtype=arr.dtype.name))


def to_ndarray(arr: np.ndarray, like: NDArray) -> NDArray:
    """``arr`` as an NDArray on the device and in the dtype of the NDArray ``like``."""
    return NDArray(np.ascontiguousarray(arr), device=like.device, dtype=like.dtype)


def empty_host(n: int, dtype: Any) -> Tuple[NDArray, np.ndarray]:
    """A length-``n`` CPU buffer allocated by needle (so ``MemoryTracker`` sees it) and a NumPy
    view of it; keep the NDArray alive as long as the view is used."""
    nd = NDArray.make((int(n),), device=cpu(), dtype=np.dtype(dtype))
    return nd, dlpack.to_dlpack(nd)

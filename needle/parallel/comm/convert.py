"""Moving collective inputs and outputs between numpy, needle NDArrays and needle Tensors.

MPI sends raw host memory, so every input becomes a C-contiguous numpy array first.  A CUDA
NDArray or Tensor is staged through the host (``.numpy()``), since the MPI wheel is not
CUDA-aware, and the result goes back to the input's device.  needle's array and tensor modules
are imported lazily, on the first call.
"""
from typing import Any, Callable, Tuple

import numpy as np

Restore = Callable[[np.ndarray], Any]


def _needle_types() -> Tuple[Any, Any]:
    """(NDArray class, Tensor class), imported on first use so that plain numpy needs neither."""
    from needle.autograd import Tensor
    from needle.backend_ndarray import NDArray
    return NDArray, Tensor


def to_numpy(a: Any) -> Tuple[np.ndarray, Restore]:
    """A C-contiguous numpy view or copy of ``a``, and a function turning results back into
    ``a``'s kind (and device)."""
    if type(a) is np.ndarray and a.flags.c_contiguous:  # the common case, first
        return a, _identity
    if isinstance(a, (np.ndarray, np.generic, int, float, bool)):
        return _contiguous(np.asarray(a)), _identity
    ndarray_cls, tensor_cls = _needle_types()
    if isinstance(a, tensor_cls):
        device = a.device

        def to_tensor(x: np.ndarray) -> Any:
            return tensor_cls(x, device=device, dtype=x.dtype.name, requires_grad=False)
        return _contiguous(a.numpy()), to_tensor
    if isinstance(a, ndarray_cls):
        from needle.backend_ndarray import array

        device = a.device

        def to_ndarray(x: np.ndarray) -> Any:
            return array(x, dtype=x.dtype.name, device=device)
        return _contiguous(a.numpy()), to_ndarray
    raise TypeError(f"collectives take numpy arrays, needle NDArrays or Tensors, not {type(a)}")


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _contiguous(x: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
    return x if x.flags.c_contiguous else x.copy(order="C")

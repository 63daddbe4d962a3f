"""The ``np`` backend (``NEEDLE_BACKEND=np``): a Tensor's data is a NumPy array, as in hw1/hw2
(docs/dtypes.md). Nothing here goes through needle's strided NDArray (hw3's exercises): hw1 and
hw2 run before it is written. The course's file of this name; the NDArray's CPU primitives are
``backend_ndarray/ndarray_backend_numpy.py``, the course's file of that name."""
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from .backend_ndarray import ndarray_backend_numpy, primitives
from .backend_ndarray.device import BackendDevice
from .backend_ndarray.dtypes import to_numpy_dtype
from .backend_ndarray.fused_ops import FUSED_PRIMITIVES
from .backend_ndarray.ndarray import NDArray

Axes = Union[None, int, Sequence[int]]


class NumpyDevice(BackendDevice):
    """The host as the ``np`` backend sees it: equal to ``cpu()``, but the arrays it makes are
    NumPy's and it offers no fused or optional primitive (every op is composed from NumPy
    calls). An NDArray asked for on it (``backend_ndarray.array(x, device=t.device)``) is a
    CPU one, which a Tensor takes as NumPy data."""

    def __init__(self) -> None:
        super().__init__("cpu", ndarray_backend_numpy)
        for name in (*FUSED_PRIMITIVES, *ndarray_backend_numpy.OPTIONAL_PRIMITIVES):
            setattr(self, name, None)  # has_primitive(device, name) is then False

    def _from_numpy(self, arr: np.ndarray, dtype: Any) -> "NumpyArray":
        return array(arr, dtype=dtype)

    def empty(self, shape: Any, dtype: Any = "float32") -> "NumpyArray":
        """An uninitialised array."""
        return np.empty(shape, dtype=to_numpy_dtype(dtype)).view(NumpyArray)

    def full(self, shape: Any, fill_value: Any, dtype: Any = "float32") -> "NumpyArray":
        """An array filled with ``fill_value``."""
        return np.full(shape, fill_value, dtype=to_numpy_dtype(dtype)).view(NumpyArray)


NUMPY_CPU = NumpyDevice()


class NumpyArray(np.ndarray):
    """A NumPy array with NDArray's method names (``permute``, ``broadcast_to``, ``compact``,
    ``exp``, ...), so the ops run on it unchanged."""

    @property
    def device(self) -> BackendDevice:  # type: ignore[override]
        """The host (``cpu()``): NumPy arrays live there."""
        return NUMPY_CPU

    @property
    def _np_dtype(self) -> np.dtype:
        return self.dtype

    def to(self, device: BackendDevice) -> "NumpyArray":
        """Itself: the ``np`` backend has only the host."""
        _check_host(device)
        return self

    def numpy(self) -> np.ndarray:
        """A plain NumPy copy."""
        return np.array(self)

    def is_compact(self) -> bool:
        """True when row-major contiguous."""
        return bool(self.flags.c_contiguous)

    def compact(self) -> "NumpyArray":
        """A row-major contiguous copy (itself when already so)."""
        return self if self.flags.c_contiguous else self.copy()

    # NumPy's stubs type what its functions return on a subclass as a plain ndarray; at run
    # time the result keeps the subclass (ndarray.__array_wrap__), hence the ignores below.
    def permute(self, new_axes: Sequence[int]) -> "NumpyArray":
        """A view with axes reordered: out.shape[i] == self.shape[new_axes[i]]."""
        return np.transpose(self, tuple(new_axes))  # type: ignore[return-value]

    def broadcast_to(self, new_shape: Sequence[int]) -> "NumpyArray":  # type: ignore[override]
        """A (read-only) view broadcast to ``new_shape``."""
        return np.broadcast_to(self, tuple(new_shape), subok=True)  # type: ignore[return-value]

    def flip(self, axes: Axes = None) -> "NumpyArray":
        """A copy reversed along ``axes`` (all when None)."""
        return np.flip(self, tuple(axes) if isinstance(axes, Sequence) else axes).copy()

    def pad(self, axes: Sequence[Tuple[int, int]], value: Any = 0) -> "NumpyArray":
        """Padded with ``value``: ``axes[i] = (before, after)``."""
        return np.pad(self, tuple(axes), constant_values=value).view(NumpyArray)


def _ufunc_method(ufunc: np.ufunc, name: str) -> Any:
    def method(self: NumpyArray, *other: Any) -> NumpyArray:
        return ufunc(self, *other)
    method.__name__, method.__doc__ = name, f"Elementwise ``np.{ufunc.__name__}``."
    return method


# NDArray's methods named for an elementwise op of the primitive table (log, exp, maximum, ...),
# each as the NumPy ufunc of the op's row
for _name, _ufunc, _ in primitives.ELEMENTWISE:
    if hasattr(NDArray, _name):
        setattr(NumpyArray, _name, _ufunc_method(getattr(np, _ufunc), _name))


def _check_host(device: Optional[BackendDevice]) -> None:
    if device is not None and device.name != "cpu":
        raise ValueError(f"NEEDLE_BACKEND=np computes with NumPy on the host; device {device!r} "
                         "needs NEEDLE_BACKEND=nd")


def array(data: Any, dtype: Any = None, device: Optional[BackendDevice] = None) -> NumpyArray:
    """A NumPy copy of ``data`` (a Tensor's data, an NDArray, NumPy data, a list or a scalar) in
    ``dtype``; without one, NumPy's own (a list of floats is float64, as in hw1)."""
    _check_host(device)
    if hasattr(data, "numpy") and not isinstance(data, np.ndarray):
        data = data.numpy()  # an NDArray (on any device): NumPy reads only host memory
    np_dtype = None if dtype is None else to_numpy_dtype(dtype)
    return np.array(data, dtype=np_dtype).view(NumpyArray)

"""NumPy-style module functions over NDArray (``needle.backend_ndarray.exp(a)`` and friends)."""
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

from .axes import Axes, check_axis
from .device import BackendDevice, default_device
from .dtypes import promote
from .ndarray import NDArray, broadcast_shapes

__all__ = ["array", "empty", "full", "zeros", "ones", "broadcast_to", "reshape", "transpose",
           "maximum", "log", "exp", "tanh", "sqrt", "sum", "max", "flip", "matmul", "stack",
           "split", "where", "take_rows", "scatter_add_rows"]


def array(a: Any, dtype: Any = None, device: Optional[BackendDevice] = None) -> NDArray:
    """A new NDArray copied from ``a`` (float32 unless ``a`` or ``dtype`` says otherwise)."""
    if dtype is None and not isinstance(a, (NDArray, np.ndarray, np.generic)):
        dtype = "float32"
    return NDArray(a, device=device, dtype=dtype)


def empty(shape: Sequence[int], dtype: Any = "float32",
          device: Optional[BackendDevice] = None) -> NDArray:
    """An uninitialised array."""
    device = device if device is not None else default_device()
    return device.empty(shape, dtype=dtype)


def full(shape: Sequence[int], fill_value: Any, dtype: Any = "float32",
         device: Optional[BackendDevice] = None) -> NDArray:
    """An array of ``shape`` filled with ``fill_value``."""
    device = device if device is not None else default_device()
    return device.full(shape, fill_value, dtype=dtype)


def zeros(shape: Sequence[int], dtype: Any = "float32",
          device: Optional[BackendDevice] = None) -> NDArray:
    """An array of zeros."""
    return full(shape, 0, dtype=dtype, device=device)


def ones(shape: Sequence[int], dtype: Any = "float32",
         device: Optional[BackendDevice] = None) -> NDArray:
    """An array of ones."""
    return full(shape, 1, dtype=dtype, device=device)


def broadcast_to(a: NDArray, shape: Sequence[int]) -> NDArray:
    """View of ``a`` broadcast to ``shape``."""
    return a.broadcast_to(shape)


def reshape(a: NDArray, new_shape: Sequence[int]) -> NDArray:
    """``a`` in a new shape."""
    return a.reshape(new_shape)


def transpose(a: NDArray, axes: Optional[Sequence[int]] = None) -> NDArray:
    """View with axes permuted (reversed when ``axes`` is None)."""
    return a.permute(tuple(range(a.ndim))[::-1] if axes is None else axes)


def _elementwise(name: str) -> Callable[..., NDArray]:
    """``name(a, ...)``: NDArray's method ``a.<name>(...)`` as a function."""
    def fn(a: NDArray, *other: Any) -> NDArray:
        return getattr(a, name)(*other)
    fn.__name__, fn.__doc__ = name, getattr(NDArray, name).__doc__
    return fn


maximum, log, exp, tanh, sqrt = map(_elementwise, ("maximum", "log", "exp", "tanh", "sqrt"))


def sum(a: NDArray, axis: Axes = None, keepdims: bool = False) -> NDArray:
    """Sum over ``axis``."""
    return a.sum(axis=axis, keepdims=keepdims)


def max(a: NDArray, axis: Axes = None, keepdims: bool = False) -> NDArray:
    """Max over ``axis``."""
    return a.max(axis=axis, keepdims=keepdims)


def flip(a: NDArray, axes: Axes = None) -> NDArray:
    """``a`` reversed along ``axes``."""
    return a.flip(axes)


def matmul(a: NDArray, b: NDArray) -> NDArray:
    """Matrix product (batched, broadcasting batch dims)."""
    return a @ b


def stack(arrays: Sequence[NDArray], axis: int = 0) -> NDArray:
    """Join same-shaped arrays along a new axis."""
    if not arrays:
        raise ValueError("stack needs at least one array")
    shape = arrays[0].shape
    for i, x in enumerate(arrays):
        if x.shape != shape:
            raise ValueError(f"stack: array {i} has shape {x.shape}, expected {shape}")
        if x.device != arrays[0].device:
            raise ValueError(f"stack: array {i} is on {x.device}, expected {arrays[0].device}")
    axis = check_axis(axis, len(shape) + 1, "stack")
    out_shape = shape[:axis] + (len(arrays),) + shape[axis:]
    out = empty(out_shape, dtype=arrays[0].dtype, device=arrays[0].device)
    for i, x in enumerate(arrays):
        out[(slice(None),) * axis + (i,)] = x
    return out


def split(a: NDArray, axis: int = 0) -> Tuple[NDArray, ...]:
    """The slices of ``a`` along ``axis`` (each compact, the axis removed)."""
    axis = axis % a.ndim
    return tuple(a[(slice(None),) * axis + (i,)].compact() for i in range(a.shape[axis]))


def where(cond: NDArray, a: NDArray, b: NDArray) -> NDArray:
    """Elementwise ``a`` where ``cond`` is true, else ``b`` (all three broadcast together)."""
    for x, name in ((a, "a"), (b, "b")):
        if x.device != cond.device:
            raise ValueError(f"where: {name} is on {x.device} but cond is on {cond.device}")
    shape = broadcast_shapes(broadcast_shapes(cond.shape, a.shape, "where"), b.shape, "where")
    dt = promote(a._np_dtype, b._np_dtype)
    args = [x.astype(t).broadcast_to(shape).compact()
            for x, t in ((cond, "bool"), (a, dt), (b, dt))]
    out = NDArray.make(shape, device=a.device, dtype=dt)
    a.device.ewise_where(args[0]._handle, args[1]._handle, args[2]._handle, out._handle)
    return out


def _row_indices(table: NDArray, indices: NDArray, num_rows: int, what: str) -> NDArray:
    """``indices`` checked (integer dtype, same device, within [0, num_rows)) and flattened."""
    if indices.device != table.device:
        raise ValueError(f"{what}: indices are on {indices.device} but the table is on "
                         f"{table.device}")
    if indices.dtype not in ("int32", "int64", "int8", "uint8"):
        raise TypeError(f"{what}: indices must be integers, got dtype {indices.dtype}")
    flat = indices.compact().reshape((indices.size,)).astype("int64")
    known = getattr(indices._handle, "known_range", None)  # a view's values lie within it
    if flat.size and not (known is not None and 0 <= known[0] and known[1] < num_rows):
        host = flat.numpy()  # indices are small next to the table: check them on the host
        lo, hi = int(host.min()), int(host.max())
        if lo < 0 or hi >= num_rows:
            raise ValueError(f"{what}: indices must lie in [0, {num_rows}), got values in "
                             f"[{lo}, {hi}]")
    return flat


def take_rows(table: NDArray, indices: NDArray) -> NDArray:
    """Rows of the 2-D ``table`` at integer ``indices`` (any shape): indices.shape + (cols,)."""
    if table.ndim != 2:
        raise ValueError(f"take_rows: table must be 2-D (rows, cols), got shape {table.shape}")
    rows, cols = table.shape
    flat = _row_indices(table, indices, rows, "take_rows")
    out = NDArray.make((flat.size, cols), device=table.device, dtype=table.dtype)
    if out.size:
        table.device.take_rows(table.compact()._handle, flat._handle, out._handle, cols)
    return out.reshape(indices.shape + (cols,))


def scatter_add_rows(src: NDArray, indices: NDArray, num_rows: int) -> NDArray:
    """A (num_rows, cols) array of zeros with row i of ``src`` added at row ``indices[i]``."""
    if src.ndim < 1 or src.shape[:-1] != indices.shape:
        raise ValueError(f"scatter_add_rows: src of shape {src.shape} does not match indices "
                         f"of shape {indices.shape} (expected indices.shape + (cols,))")
    cols = src.shape[-1]
    flat = _row_indices(src, indices, num_rows, "scatter_add_rows")
    out = zeros((num_rows, cols), dtype=src.dtype, device=src.device)
    if flat.size and cols:
        src.device.scatter_add_rows(src.compact()._handle, flat._handle, out._handle, cols)
    return out

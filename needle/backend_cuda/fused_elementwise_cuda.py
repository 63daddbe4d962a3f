"""The CUDA backend's ``fused_elementwise``: the same statements (``kernel_expr.py``) as one
line of CUDA C each in a CuPy ElementwiseKernel."""
import math
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from ._runtime import cp, device
from .c_expr import body_lines

_CTYPE = {np.dtype("float32"): "float", np.dtype("float64"): "double",
          np.dtype("bool"): "bool"}


def kernel_parts(expr: str, in_types: Sequence[np.dtype], n_arrays: int,
                 out_type: np.dtype) -> Tuple[str, str, str]:
    """(in_params, out_params, body) for ``cupy.ElementwiseKernel``.

    Parameter types are NumPy dtype names (``float32 x0``): CuPy reads ``float`` as float64's
    alias and refuses it ("Wrong type float").
    """
    names = [f"x{j}" for j in range(n_arrays)] + \
        [f"c{j}" for j in range(len(in_types) - n_arrays)]
    params = ", ".join(f"{_dtype_name(t)} {n}" for n, t in zip(names, in_types))
    return params, f"{_dtype_name(out_type)} out", "\n".join(body_lines(expr))


def _dtype_name(t: np.dtype) -> str:
    t = np.dtype(t)
    if t not in _CTYPE:
        raise TypeError(f"fused_elementwise: no CUDA kernel for dtype {t}")
    return t.name


_KERNELS: Dict[Tuple, Any] = {}


def fused_elementwise(expr: str, inputs: Sequence[Any], out: Any, shape: Tuple[int, ...],
                      reduce: Optional[Tuple[str, int, int]] = None) -> None:
    """The CPU primitive's contract (see backend_ndarray/fused_elementwise_cpu.py) on a GPU."""
    with device(out.device_index):  # the scratch buffer and the launch on out's GPU
        _fused_elementwise(expr, inputs, out, shape, reduce)


def _fused_elementwise(expr: str, inputs: Sequence[Any], out: Any, shape: Tuple[int, ...],
                       reduce: Optional[Tuple[str, int, int]]) -> None:
    arrays = [x for x in inputs if isinstance(x, tuple)]
    scalars = [x for x in inputs if not isinstance(x, tuple)]
    views = []
    for arr, vshape, strides, offset in arrays:
        base = arr.array
        item = base.dtype.itemsize
        views.append(cp.lib.stride_tricks.as_strided(
            base[offset:], shape=vshape, strides=tuple(s * item for s in strides)))
    out_dtype = np.dtype(out.array.dtype)
    types = [v.dtype for v in views] + [np.asarray(s).dtype for s in scalars]
    key = (expr, tuple(str(t) for t in types), str(out_dtype))
    kernel = _KERNELS.get(key)
    if kernel is None:
        kernel = _KERNELS[key] = cp.ElementwiseKernel(
            *kernel_parts(expr, types, len(views), out_dtype), "needle_fused")
    if reduce is None:
        kernel(*views, *scalars, out.array[: math.prod(shape)].reshape(shape))
        return
    op, reduce_size, inner = reduce
    size = math.prod(shape)
    # the map's result in a scratch buffer from needle's pool (an Array like ``out``), then
    # CuPy's reduction straight into ``out``: no new CuPy buffer, so a CUDA graph captures it
    scratch = type(out)(size, out_dtype, out.device_index)
    kernel(*views, *scalars, scratch.array.reshape(shape))
    src = scratch.array.reshape(-1, reduce_size, inner)
    dst = out.array[: size // reduce_size].reshape(-1, inner)
    getattr(src, op)(axis=1, out=dst)  # op: "sum" or "max"

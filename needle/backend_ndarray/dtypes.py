"""dtype names <-> NumPy dtypes (bfloat16 comes from ml_dtypes)."""
from typing import Any, Dict

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)

FLOATS = ("float16", "bfloat16", "float32", "float64")  # the floating dtypes, narrowest first
SUPPORTED = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "bool", "int8", "uint8")
_CACHE: Dict[Any, np.dtype] = {}


def to_numpy_dtype(dtype: Any) -> np.dtype:
    """Resolve a dtype given as a name, numpy dtype or type into a supported numpy dtype."""
    try:
        return _CACHE[dtype]
    except (KeyError, TypeError):
        pass
    if dtype is None:
        return np.dtype(np.float32)
    if isinstance(dtype, str) and dtype == "bfloat16":
        res = bfloat16
    else:
        try:
            res = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"unknown dtype {dtype!r}; supported: {', '.join(SUPPORTED)}") from None
    if res.name not in SUPPORTED:
        raise TypeError(f"unsupported dtype {res.name!r}; supported: {', '.join(SUPPORTED)}")
    try:
        _CACHE[dtype] = res
    except TypeError:
        pass
    return res


def is_floating(dtype: np.dtype) -> bool:
    """True for float16/32/64 and bfloat16."""
    return dtype.kind == "f" or dtype == bfloat16


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """The result dtype of a binary op on arrays of dtypes ``a`` and ``b``.

    PyTorch's rule: a float with an int or bool is that float (NumPy would widen float32 with
    int64 to float64); otherwise NumPy's, the wider type winning.
    """
    if a == b:
        return a
    if is_floating(a) != is_floating(b):
        return a if is_floating(a) else b
    if bfloat16 in (a, b):
        other = b if a == bfloat16 else a
        # bf16 with ints/bools stays bf16; with another float it widens to that float (>= fp32)
        if other.kind in "biu":
            return bfloat16
        return other if other.itemsize >= 4 else np.dtype(np.float32)
    return np.result_type(a, b)

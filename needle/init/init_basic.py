"""Basic tensor constructors: random, constant and one-hot tensors on any device. Random draws
use NumPy's *global* RNG, so ``np.random.seed(s)`` reproduces the course's values."""
import numbers as abc
from typing import Any, Optional

import numpy as np

from .. import numbers
from ..autograd import Tensor
from ..backend_ndarray import (
    BackendDevice,
    NDArray,
    default_device,
    to_numpy_dtype,
)


def _device(device: Optional[BackendDevice]) -> BackendDevice:
    device = default_device() if device is None else device
    if not isinstance(device, BackendDevice):
        raise TypeError(f"device must be a needle BackendDevice, got {type(device).__name__}")
    return device


def _sizes(name: str, shape: tuple) -> tuple:
    """``shape`` as whole sizes >= 0 (NumPy's 'negative dimensions' or 'float object cannot be
    interpreted as an integer' otherwise; a nan size, a str or a bool named here instead)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        raise TypeError(f"{name}(*shape) takes sizes as separate arguments: {name}"
                        f"({', '.join(map(str, shape[0]))}), not {name}({tuple(shape[0])})")
    for n in shape:  # (the common case first: no call per size)
        if type(n) is not int or n < 0:
            break
    else:
        return shape
    return tuple(numbers.count_arg(n, f"{name}: size", lo=0) for n in shape)


def _real(x: Any, name: str, lo: Optional[float] = None) -> float:
    """``x`` if a finite float or int (>= lo), else ``numbers.real_arg``'s check of it."""
    if type(x) in (float, int) and x - x == 0 and (lo is None or x >= lo):  # (nan - nan is nan)
        return x
    return numbers.real_arg(x, name, lo=lo)


def _sample_dtype(dtype: Any) -> str:
    """Floating dtypes sample at their own precision; others sample in float32, then cast."""
    np_dtype = to_numpy_dtype(dtype)
    return np_dtype.name if np_dtype.kind == "f" else "float32"


def rand(*shape: int, low: float = 0.0, high: float = 1.0, device: Optional[BackendDevice] = None,
         dtype: str = "float32", requires_grad: bool = False) -> Tensor:
    """Uniform samples in [low, high).

    Drawn with the device's ``rand`` (NumPy's global RNG, ``np.random.rand``), so seeded
    results match the course's; scaled and shifted from [0, 1)."""
    shape = _sizes("rand", shape)
    low, high = _real(low, "rand: low"), _real(high, "rand: high")
    if low > high:
        raise ValueError(f"rand: low {low} must be <= high {high}")
    ### BEGIN YOUR SOLUTION (hw2.init.rand)
    device = _device(device)
    array = device.rand(*shape, dtype=_sample_dtype(dtype)) * (high - low) + low
    return Tensor(array, device=device, dtype=dtype, requires_grad=requires_grad)
    ### END YOUR SOLUTION


def randn(*shape: int, mean: float = 0.0, std: float = 1.0, device: Optional[BackendDevice] = None,
          dtype: str = "float32", requires_grad: bool = False) -> Tensor:
    """Normal samples with the given mean and standard deviation.

    Drawn with the device's ``randn`` (NumPy's global RNG, ``np.random.randn``), so seeded
    results match the course's."""
    shape = _sizes("randn", shape)
    mean, std = _real(mean, "randn: mean"), _real(std, "randn: std", lo=0)
    ### BEGIN YOUR SOLUTION (hw2.init.rand)
    device = _device(device)
    array = device.randn(*shape, dtype=_sample_dtype(dtype)) * std + mean
    return Tensor(array, device=device, dtype=dtype, requires_grad=requires_grad)
    ### END YOUR SOLUTION


def constant(*shape: int, c: float = 1.0, device: Optional[BackendDevice] = None,
             dtype: str = "float32", requires_grad: bool = False) -> Tensor:
    """A tensor filled with ``c``."""
    shape = _sizes("constant", shape)
    if not isinstance(c, abc.Number):
        raise TypeError(f"constant: c must be a number, got {type(c).__name__} {c!r}")
    ### BEGIN YOUR SOLUTION (hw2.init.rand)
    device = _device(device)
    array = device.full(shape, c, dtype=dtype)
    return Tensor(array, device=device, dtype=dtype, requires_grad=requires_grad)
    ### END YOUR SOLUTION


def ones(*shape: int, device: Optional[BackendDevice] = None, dtype: str = "float32",
         requires_grad: bool = False) -> Tensor:
    """A tensor of ones."""
    return constant(*shape, c=1.0, device=device, dtype=dtype, requires_grad=requires_grad)


def zeros(*shape: int, device: Optional[BackendDevice] = None, dtype: str = "float32",
          requires_grad: bool = False) -> Tensor:
    """A tensor of zeros."""
    return constant(*shape, c=0.0, device=device, dtype=dtype, requires_grad=requires_grad)


def randb(*shape: int, p: float = 0.5, device: Optional[BackendDevice] = None,
          dtype: str = "bool", requires_grad: bool = False) -> Tensor:
    """Bernoulli samples: True (1) with probability ``p``: the device's ``rand`` <= p."""
    shape = _sizes("randb", shape)
    if not (type(p) in (float, int) and 0 <= p <= 1):
        p = numbers.real_arg(p, "randb: p", lo=0, hi=1)
    ### BEGIN YOUR SOLUTION (hw2.init.rand)
    device = _device(device)
    array = device.rand(*shape) <= p
    return Tensor(array, device=device, dtype=dtype, requires_grad=requires_grad)
    ### END YOUR SOLUTION


def one_hot(n: int, i: Any, device: Optional[BackendDevice] = None, dtype: str = "float32",
            requires_grad: bool = False) -> Tensor:
    """Rows of the n x n identity picked by the integer indices ``i`` (shape i.shape + (n,))."""
    if type(n) is not int or n < 0:
        n = numbers.count_arg(n, "one_hot: n", lo=0)
    ### BEGIN YOUR SOLUTION (hw2.init.rand)
    device = _device(device)
    data = i.realize_cached_data() if isinstance(i, Tensor) else i
    if isinstance(data, NDArray) and data.dtype in ("int32", "int64") and data.device == device:
        # integer labels already on the device: compare them with arange(n) there, so no
        # n x n identity is built (a step stays traceable by needle.compile)
        return Tensor(device.one_hot(n, data, dtype=dtype), device=device, dtype=dtype,
                      requires_grad=requires_grad)
    if isinstance(i, (Tensor, NDArray)):
        i = i.numpy()
    idx = np.asarray(i)
    if idx.dtype.kind == "f":
        if not np.all(np.equal(np.mod(idx, 1), 0)):
            raise ValueError("one_hot: indices must be whole numbers")
    elif idx.dtype.kind not in "iub":
        raise TypeError(f"one_hot: indices must be integers, got dtype {idx.dtype}")
    array = device.one_hot(n, idx.astype(np.int64), dtype=dtype)
    return Tensor(array, device=device, dtype=dtype, requires_grad=requires_grad)
    ### END YOUR SOLUTION


def zeros_like(array: Tensor, *, device: Optional[BackendDevice] = None,
               requires_grad: bool = False) -> Tensor:
    """Zeros with the shape and dtype of ``array`` (on its device unless one is given)."""
    device = device if device is not None else array.device
    return zeros(*array.shape, dtype=array.dtype, device=device, requires_grad=requires_grad)


def ones_like(array: Tensor, *, device: Optional[BackendDevice] = None,
              requires_grad: bool = False) -> Tensor:
    """Ones with the shape and dtype of ``array`` (on its device unless one is given)."""
    device = device if device is not None else array.device
    return ones(*array.shape, dtype=array.dtype, device=device, requires_grad=requires_grad)

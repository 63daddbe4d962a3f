"""Weight initializers: Xavier/Glorot and Kaiming/He, uniform and normal.

Xavier: Glorot & Bengio, "Understanding the difficulty of training deep feedforward neural
networks" (AISTATS 2010): Var(w) = gain^2 * 2 / (fan_in + fan_out).
Kaiming: He et al., "Delving Deep into Rectifiers" (arXiv:1502.01852): Var(w) = gain^2 / fan_in.

The tensor has shape ``(fan_in, fan_out)`` unless ``shape`` is given. For a convolution kernel
``shape=(K, K, C_in, C_out)`` the caller passes ``fan_in = K*K*C_in`` (as the course's hw4 does);
when ``fan_in``/``fan_out`` are None they are computed from ``shape`` that way.
"""
import math
from typing import Any, Optional, Tuple

from .. import numbers
from ..autograd import Tensor
from .init_basic import _real, rand, randn

_GAINS = {"linear": 1.0, "identity": 1.0, "sigmoid": 1.0, "tanh": 5.0 / 3.0,
          "relu": math.sqrt(2.0)}


def calculate_gain(nonlinearity: str) -> float:
    """The recommended gain for ``nonlinearity`` (relu: sqrt(2), tanh: 5/3, linear: 1)."""
    try:
        return _GAINS[nonlinearity]
    except KeyError:
        raise ValueError(f"unknown nonlinearity {nonlinearity!r}; known: "
                         f"{', '.join(sorted(_GAINS))}") from None


def _fans(fan_in: Optional[int], fan_out: Optional[int],
          shape: Optional[Tuple[int, ...]]) -> Tuple[int, int, Tuple[int, ...]]:
    """(fan_in, fan_out, shape), filling what is missing (kernels are (K, K, C_in, C_out))."""
    if shape is not None:
        shape = tuple(shape)
        receptive = math.prod(shape[:-2])
        if fan_in is None:
            fan_in = receptive * shape[-2] if len(shape) >= 2 else shape[0]
        if fan_out is None:
            fan_out = receptive * shape[-1]
    if fan_in is None or fan_out is None:
        raise ValueError("initializer needs fan_in and fan_out, or a shape")
    if not (isinstance(fan_in, int) and isinstance(fan_out, int) and fan_in > 0 and fan_out > 0):
        fan_in = numbers.count_arg(fan_in, "initializer fan_in", lo=1)  # 2.5, nan, -1: named
        fan_out = numbers.count_arg(fan_out, "initializer fan_out", lo=1)
    return fan_in, fan_out, shape if shape is not None else (fan_in, fan_out)


def xavier_uniform(fan_in: int, fan_out: int, gain: float = 1.0,
                   shape: Optional[Tuple[int, ...]] = None, **kwargs: Any) -> Tensor:
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010), drawn
    with ``rand``."""
    fan_in, fan_out, shape = _fans(fan_in, fan_out, shape)
    gain = _real(gain, "xavier_uniform: gain", lo=0)
    ### BEGIN YOUR SOLUTION (hw2.init.fan)
    a = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return rand(*shape, low=-a, high=a, **kwargs)
    ### END YOUR SOLUTION


def xavier_normal(fan_in: int, fan_out: int, gain: float = 1.0,
                  shape: Optional[Tuple[int, ...]] = None, **kwargs: Any) -> Tensor:
    """N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out)) (Glorot & Bengio, 2010),
    drawn with ``randn``."""
    fan_in, fan_out, shape = _fans(fan_in, fan_out, shape)
    gain = _real(gain, "xavier_normal: gain", lo=0)
    ### BEGIN YOUR SOLUTION (hw2.init.fan)
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    return randn(*shape, mean=0.0, std=std, **kwargs)
    ### END YOUR SOLUTION


def kaiming_uniform(fan_in: int, fan_out: int, nonlinearity: str = "relu",
                    shape: Optional[Tuple[int, ...]] = None, **kwargs: Any) -> Tensor:
    """U(-b, b) with b = gain * sqrt(3 / fan_in) (He et al., 2015), drawn with ``rand``.

    gain = ``calculate_gain(nonlinearity)``: sqrt(2) for the course's default, relu."""
    fan_in, fan_out, shape = _fans(fan_in, fan_out, shape)
    ### BEGIN YOUR SOLUTION (hw2.init.fan)
    bound = calculate_gain(nonlinearity) * math.sqrt(3.0 / fan_in)
    return rand(*shape, low=-bound, high=bound, **kwargs)
    ### END YOUR SOLUTION


def kaiming_normal(fan_in: int, fan_out: int, nonlinearity: str = "relu",
                   shape: Optional[Tuple[int, ...]] = None, **kwargs: Any) -> Tensor:
    """N(0, std^2) with std = gain / sqrt(fan_in) (He et al., 2015), drawn with ``randn``.

    gain = ``calculate_gain(nonlinearity)``: sqrt(2) for the course's default, relu."""
    fan_in, fan_out, shape = _fans(fan_in, fan_out, shape)
    ### BEGIN YOUR SOLUTION (hw2.init.fan)
    std = calculate_gain(nonlinearity) / math.sqrt(fan_in)
    return randn(*shape, mean=0.0, std=std, **kwargs)
    ### END YOUR SOLUTION

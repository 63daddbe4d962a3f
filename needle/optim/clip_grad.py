"""Gradient-norm clipping (Pascanu et al., "On the difficulty of training RNNs", ICML 2013)."""
import math
from typing import Iterable

from .. import numbers
from ..autograd import Tensor
from .optimizer import unique_by_identity


def _unique_with_grad(params: Iterable[Tensor]) -> list:
    return [p for p in unique_by_identity(params) if p.grad is not None]


def grad_norm(params: Iterable[Tensor]) -> float:
    """The global L2 norm of all gradients (each parameter counted once)."""
    total = 0.0
    for p in _unique_with_grad(params):
        g = p.grad.realize_cached_data()
        total += float((g * g).sum().numpy())
    return math.sqrt(total)


def clip_grad_norm(params: Iterable[Tensor], max_norm: float, eps: float = 1e-6) -> float:
    """Scale gradients so their global L2 norm is at most ``max_norm``; return the norm before."""
    max_norm = numbers.positive(max_norm, "clip_grad_norm: max_norm")  # nan never clipped
    eps = numbers.real(eps, "clip_grad_norm: eps", lo=0)
    params = _unique_with_grad(params)
    total = grad_norm(params)
    coef = max_norm / (total + eps)
    if coef < 1.0:
        for p in params:
            p.grad = Tensor.make_const(p.grad.realize_cached_data() * coef)
    return total


clip_grad_norm_ = clip_grad_norm

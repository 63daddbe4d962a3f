"""Dropout as one op (Srivastava et al., JMLR 2014): y = x * mask / (1 - p). On a device
offering the ``dropout`` primitive (``ndl.cuda()``), where ``nn.Dropout`` uses it, the mask is
drawn and applied in one kernel, with no host random numbers copied to the device; every other
device composes it from NDArray ops (``backend_ndarray/fused_ops.py``)."""
from typing import Any, Optional

from ..autograd import NDArray, Tensor, TensorOp
from ..backend_ndarray import fused_ops as fused

__all__ = ["Dropout", "dropout"]


class Dropout(TensorOp):
    """Zero each entry with probability ``p`` and scale the rest by 1 / (1 - p)."""

    def __init__(self, p: float, seed: Optional[int] = None):
        self.p = p
        self.seed = seed
        self.mask: Any = None  # the bool keep-mask of the forward, reused by the gradient

    def compute(self, x: NDArray) -> NDArray:
        y, self.mask = fused.dropout(x, self.p, self.seed)
        return y

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        scale = Tensor(self.mask.astype(out_grad.dtype), device=out_grad.device,
                       requires_grad=False)
        return out_grad * scale / (1 - self.p)


def dropout(x: Tensor, p: float, seed: Optional[int] = None) -> Tensor:
    """Inverted dropout of ``x`` with drop probability ``p`` (mask seeded by ``seed``)."""
    return Dropout(p, seed)(x)

"""Differentiable indexing: ``x[idx]`` with ints, slices (with steps) and Ellipsis."""
from typing import Any, Tuple

from ..autograd import NDArray, Tensor, TensorOp
from .. import backend_ndarray as array_api

__all__ = ["GetItem", "get_item", "ScatterItem"]


class GetItem(TensorOp):
    """``a[idxs]``; the gradient scatters ``out_grad`` back into zeros of ``a``'s shape."""

    def __init__(self, idxs: Any):
        self.idxs = idxs

    def compute(self, a: NDArray) -> NDArray:
        return a[self.idxs].compact()

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return ScatterItem(self.idxs, node.inputs[0].shape)(out_grad)


class ScatterItem(TensorOp):
    """zeros(shape) with ``a`` written at ``idxs`` (the adjoint of GetItem)."""

    def __init__(self, idxs: Any, shape: Tuple[int, ...]):
        self.idxs = idxs
        self.shape = shape

    def compute(self, a: NDArray) -> NDArray:
        out = array_api.full(self.shape, 0, dtype=a.dtype, device=a.device)
        out[self.idxs] = a
        return out

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return GetItem(self.idxs)(out_grad)


def get_item(a: Tensor, idxs: Any) -> Tensor:
    """``a[idxs]`` for int/slice/Ellipsis indices (ints drop their axis, as in NumPy)."""
    if isinstance(idxs, list) or (isinstance(idxs, tuple) and any(
            isinstance(i, (list, Tensor, NDArray)) for i in idxs)) or isinstance(
            idxs, (Tensor, NDArray)):
        raise TypeError("needle indexing takes ints, slices and Ellipsis; use ops.embedding-style "
                        "one-hot matmul or ops.split for gathers")
    return GetItem(idxs)(a)

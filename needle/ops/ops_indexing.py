"""Differentiable indexing: ``x[idx]`` with ints, slices (with steps) and Ellipsis, and
embedding lookups (``embedding(table, indices)``: gather rows, scatter-add their gradient)."""
from typing import Any, Tuple

import numpy as np

from .. import backend_ndarray as array_api
from ..autograd import NDArray, Tensor, TensorOp

__all__ = ["GetItem", "get_item", "ScatterItem", "TakeRows", "ScatterAddRows", "embedding"]


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
    if any(isinstance(i, (list, Tensor, NDArray))
           for i in (idxs if isinstance(idxs, tuple) else (idxs,))):
        raise TypeError("needle indexing takes ints, slices and Ellipsis; use ops.embedding-style "
                        "one-hot matmul or ops.split for gathers")
    return GetItem(idxs)(a)


class TakeRows(TensorOp):
    """Rows of a 2-D table at constant integer indices: an embedding lookup by gathering.

    The one-hot formulation (``one_hot(idx) @ table``) costs a (n, rows) x (rows, cols) matmul
    each way; gathering costs n * cols copies, and its adjoint adds rows back (scatter-add).
    """

    def __init__(self, indices: NDArray):
        self.indices = indices

    def compute(self, table: NDArray) -> NDArray:
        return array_api.take_rows(table, self.indices)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return ScatterAddRows(self.indices, node.inputs[0].shape[0])(out_grad)


class ScatterAddRows(TensorOp):
    """zeros(num_rows, cols) with row i of the input added at row ``indices[i]``."""

    def __init__(self, indices: NDArray, num_rows: int):
        self.indices = indices
        self.num_rows = num_rows

    def compute(self, a: NDArray) -> NDArray:
        return array_api.scatter_add_rows(a, self.indices, self.num_rows)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return TakeRows(self.indices)(out_grad)


def embedding(table: Tensor, indices: Any) -> Tensor:
    """``table[indices]`` for a (rows, cols) table and integer indices of any shape."""
    if isinstance(indices, Tensor):
        indices = indices.realize_cached_data()
    if isinstance(indices, NDArray) and indices.dtype in ("int32", "int64", "int8", "uint8"):
        return TakeRows(indices)(table)
    # float tensors of whole numbers are accepted, as the course's one_hot accepts them
    host = np.asarray(indices.numpy() if isinstance(indices, NDArray) else indices)
    if host.dtype.kind == "f" and not np.array_equal(host, np.round(host)):
        raise TypeError(f"embedding: indices must be whole numbers, got dtype {host.dtype} "
                        f"with fractional values")
    if host.dtype.kind not in "fiu":
        raise TypeError(f"embedding: indices must be integers, got dtype {host.dtype}")
    return TakeRows(array_api.array(host.astype(np.int64), dtype="int64",
                                    device=table.device))(table)

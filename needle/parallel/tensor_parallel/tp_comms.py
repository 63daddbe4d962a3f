"""The communication of tensor and sequence parallelism, as autograd ops.

Megatron-LM (arXiv:1909.08053, sec. 3, Fig. 3): ``f`` (identity forward, allreduce backward)
and ``g`` (allreduce forward, identity backward). Sequence parallelism (arXiv:2205.05198, sec.
4.2.2) splits each allreduce into an all-gather along the sequence (``g``) and a reduce-scatter
(``g-bar``). Each gradient is written with the conjugate op, so gradients are Tensors.
Activations are (B, T, ...) with the sequence on axis 1.
"""
from typing import Optional

import numpy as np

from ...autograd import NDArray, Tensor, TensorOp
from ..comm.engine.convert import to_ndarray
from ..comm.protocol import Comm

__all__ = ["copy_to_region", "reduce_from_region", "gather_from_region", "scatter_to_region",
           "gather_from_sequence_region", "reduce_scatter_to_sequence_region"]


def chunk(x: np.ndarray, axis: int, rank: int, size: int) -> np.ndarray:
    """Part ``rank`` of ``size`` equal parts of ``x`` along ``axis`` (a copy)."""
    n = x.shape[axis]
    if n % size:
        raise ValueError(f"cannot split axis {axis} of length {n} into {size} equal parts")
    w = n // size
    return np.take(x, np.arange(rank * w, (rank + 1) * w), axis=axis)


def allgather_axis(comm: Comm, x: np.ndarray, axis: int,
                   label: Optional[str] = None) -> np.ndarray:
    """All-gather along ``axis`` (the communicator concatenates along axis 0)."""
    moved = np.ascontiguousarray(np.moveaxis(x, axis, 0))
    return np.moveaxis(comm.allgather(moved, label=label), 0, axis)


def _reduce_scatter_axis(comm: Comm, x: np.ndarray, axis: int, label: str) -> np.ndarray:
    """Sum over ranks, keep this rank's equal chunk of ``axis``."""
    if x.shape[axis] % comm.size:
        raise ValueError(f"reduce-scatter: axis {axis} of length {x.shape[axis]} does not "
                         f"split into {comm.size} equal parts")
    moved = np.ascontiguousarray(np.moveaxis(x, axis, 0))
    return np.moveaxis(comm.reduce_scatter(moved, label=label), 0, axis)


class CopyToRegion(TensorOp):
    """Megatron's f (arXiv:1909.08053, Fig. 3a): identity forward, allreduce backward."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def compute(self, a: NDArray) -> NDArray:
        return a

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return ReduceFromRegion(self.comm, "tp.f.backward")(out_grad)


class ReduceFromRegion(TensorOp):
    """Megatron's g (arXiv:1909.08053, Fig. 3b): allreduce forward, identity backward."""

    def __init__(self, comm: Comm, label: str = "tp.g", context: int = 0) -> None:
        self.comm, self.label, self.context = comm, label, context

    def compute(self, a: NDArray) -> NDArray:
        return to_ndarray(self.comm.allreduce(a.numpy(), label=self.label,
                                              context=self.context), a)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return copy_to_region(out_grad, self.comm)


class GatherFromRegion(TensorOp):
    """All-gather along the last axis forward, keep this rank's slice backward (Megatron's
    ``gather_output`` of a column-parallel layer, arXiv:1909.08053 sec. 3)."""

    def __init__(self, comm: Comm, label: str = "tp.gather") -> None:
        self.comm, self.label = comm, label

    def compute(self, a: NDArray) -> NDArray:
        return to_ndarray(allgather_axis(self.comm, a.numpy(), a.ndim - 1, self.label), a)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return scatter_to_region(out_grad, self.comm)


class ScatterToRegion(TensorOp):
    """Keep this rank's slice of the last axis forward, all-gather it backward (the input of
    a row-parallel layer whose input is not yet split, arXiv:1909.08053 sec. 3)."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def compute(self, a: NDArray) -> NDArray:
        return to_ndarray(chunk(a.numpy(), a.ndim - 1, self.comm.rank, self.comm.size), a)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return GatherFromRegion(self.comm, "tp.scatter.backward")(out_grad)


class GatherFromSequenceRegion(TensorOp):
    """Korthikanti's g (arXiv:2205.05198, sec. 4.2.2): all-gather along the sequence axis
    forward, reduce-scatter along it backward."""

    def __init__(self, comm: Comm, axis: int = 1, label: str = "sp.g") -> None:
        self.comm, self.axis, self.label = comm, axis, label

    def compute(self, a: NDArray) -> NDArray:
        return to_ndarray(allgather_axis(self.comm, a.numpy(), self.axis, self.label), a)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return ReduceScatterToSequenceRegion(self.comm, self.axis, "sp.g.backward")(out_grad)


class ReduceScatterToSequenceRegion(TensorOp):
    """Korthikanti's g-bar (arXiv:2205.05198, sec. 4.2.2): reduce-scatter along the sequence
    axis forward, all-gather along it backward."""

    def __init__(self, comm: Comm, axis: int = 1, label: str = "sp.g_bar") -> None:
        self.comm, self.axis, self.label = comm, axis, label

    def compute(self, a: NDArray) -> NDArray:
        return to_ndarray(_reduce_scatter_axis(self.comm, a.numpy(), self.axis, self.label), a)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return GatherFromSequenceRegion(self.comm, self.axis, "sp.g_bar.backward")(out_grad)


def copy_to_region(x: Tensor, comm: Comm) -> Tensor:
    """f: identity forward, allreduce of the gradient backward."""
    return CopyToRegion(comm)(x)


def reduce_from_region(x: Tensor, comm: Comm, context: int = 0) -> Tensor:
    """g: allreduce forward, identity backward; ``context``: an int every rank must pass
    equal (the communicator's argument check compares it, with no extra message)."""
    return ReduceFromRegion(comm, context=context)(x)


def gather_from_region(x: Tensor, comm: Comm) -> Tensor:
    """All-gather the last axis (backward: keep this rank's slice)."""
    return GatherFromRegion(comm)(x)


def scatter_to_region(x: Tensor, comm: Comm) -> Tensor:
    """This rank's slice of the last axis (backward: all-gather)."""
    return ScatterToRegion(comm)(x)


def gather_from_sequence_region(x: Tensor, comm: Comm, axis: int = 1) -> Tensor:
    """SP's g: all-gather the sequence axis (backward: reduce-scatter)."""
    return GatherFromSequenceRegion(comm, axis)(x)


def reduce_scatter_to_sequence_region(x: Tensor, comm: Comm, axis: int = 1) -> Tensor:
    """SP's g-bar: reduce-scatter the sequence axis (backward: all-gather)."""
    return ReduceScatterToSequenceRegion(comm, axis)(x)

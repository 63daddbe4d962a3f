"""All-to-all with uneven splits, as an autograd op (expert parallelism's dispatch and combine):
chunks padded to ``max_rows``; the gradient swaps send and receive counts."""
from typing import Sequence, Union

import numpy as np

from ...autograd import NDArray, Tensor, TensorOp
from ..comm.engine.convert import to_ndarray
from ..comm.protocol import Comm

__all__ = ["all_to_all"]

Counts = Union[Sequence[int], np.ndarray]  # rows per rank


class AllToAll(TensorOp):
    """Rows [sum(send[:j]), sum(send[:j+1])) go to rank j; received rows concatenated by rank."""

    def __init__(self, comm: Comm, send_counts: Counts, recv_counts: Counts,
                 max_rows: int, label: str = "moe.all_to_all") -> None:
        self.comm, self.max_rows, self.label = comm, max_rows, label
        self.send = np.asarray(send_counts, dtype=np.int64)
        self.recv = np.asarray(recv_counts, dtype=np.int64)

    def compute(self, a: NDArray) -> NDArray:
        x = a.numpy()                                                # (S, d)
        p, m = self.comm.size, max(self.max_rows, 1)
        if x.shape[0] != self.send.sum():
            raise ValueError(f"all_to_all: {x.shape[0]} rows but send counts sum to "
                             f"{self.send.sum()}")
        buf = np.zeros((p, m) + x.shape[1:], dtype=x.dtype)          # (p, M, d) padded
        starts = np.concatenate([[0], np.cumsum(self.send)])
        for j in range(p):
            buf[j, :self.send[j]] = x[starts[j]:starts[j + 1]]
        flat = buf.reshape((p * m,) + x.shape[1:])
        got = self.comm.alltoall(flat, label=self.label).reshape(buf.shape)
        out = np.concatenate([got[j, :self.recv[j]] for j in range(p)], axis=0)
        return to_ndarray(out, like=a)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return AllToAll(self.comm, self.recv, self.send, self.max_rows,
                        self.label + ".backward")(out_grad)


def all_to_all(x: Tensor, comm: Comm, send_counts: Sequence[int], recv_counts: Sequence[int],
               max_rows: int, label: str = "moe.all_to_all") -> Tensor:
    """Exchange row blocks of x (S, d) between all ranks (uneven sizes, padded to max_rows)."""
    return AllToAll(comm, send_counts, recv_counts, max_rows, label)(x)

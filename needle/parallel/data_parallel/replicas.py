"""Keeping model replicas in agreement: same shapes on every rank (checked, the same error on
every rank), then rank 0's values everywhere (PyTorch's ``sync_module_states``)."""
from typing import Any, List, Sequence, Tuple

import numpy as np

from ...autograd import Tensor
from ...backend_ndarray import NDArray
from ...backend_ndarray.dtypes import SUPPORTED
from ...nn import Module
from ..comm.protocol import Comm

__all__ = ["check_same_shapes", "broadcast_tensors", "replicate_from_rank0"]

MAX_DIMS = 8


def _data(x: Any) -> NDArray:
    return x.realize_cached_data() if isinstance(x, Tensor) else x


def _describe(shapes: Sequence[Tuple[int, ...]], dtypes: Sequence[str]) -> np.ndarray:
    """One int64 row per tensor: ndim, dims (padded), dtype code."""
    rows = np.zeros((len(shapes), MAX_DIMS + 2), dtype=np.int64)
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        if len(shape) > MAX_DIMS:
            raise ValueError(f"tensors of more than {MAX_DIMS} dimensions are not supported")
        rows[i, 0] = len(shape)
        rows[i, 1:1 + len(shape)] = shape
        rows[i, -1] = SUPPORTED.index(dtype) if dtype in SUPPORTED else -1
    return rows


def _unpack(row: np.ndarray) -> Tuple[Tuple[int, ...], str]:
    shape = tuple(int(d) for d in row[1:1 + int(row[0])])
    dtype = SUPPORTED[int(row[-1])] if row[-1] >= 0 else "other"
    return shape, dtype


def check_same_shapes(comm: Comm, named: Sequence[Tuple[str, Any]], what: str) -> None:
    """Raise on every rank unless all ranks hold (name, Tensor) lists of equal shapes and dtypes."""
    if comm.size == 1:
        return
    counts = comm.allgather(np.array([len(named)], dtype=np.int64))
    if len(set(counts.tolist())) > 1:
        per_rank = ", ".join(f"rank {r}: {int(c)}" for r, c in enumerate(counts))
        raise ValueError(f"{what}: ranks hold different numbers of tensors ({per_rank}); every "
                         f"rank must build the same model (seen from rank {comm.rank})")
    if not named:
        return
    mine = _describe([tuple(t.shape) for _, t in named], [t.dtype for _, t in named])
    table = comm.allgather(mine).reshape(comm.size, len(named), -1)
    for i, (name, _) in enumerate(named):
        for r in range(1, comm.size):
            if not np.array_equal(table[r, i], table[0, i]):
                (s0, d0), (sr, dr) = _unpack(table[0, i]), _unpack(table[r, i])
                raise ValueError(f"{what}: parameter {name!r} has shape {sr} ({dr}) on rank {r} "
                                 f"but {s0} ({d0}) on rank 0; every rank must build the same "
                                 f"model (seen from rank {comm.rank})")


def broadcast_tensors(comm: Comm, tensors: Sequence[Tensor], root: int = 0) -> None:
    """Overwrite each tensor's data with ``root``'s, in one broadcast of their packed bytes."""
    if comm.size == 1 or not tensors:
        return
    raw: List[np.ndarray] = [np.ascontiguousarray(_data(t).numpy()).reshape(-1).view(np.uint8)
                             for t in tensors]
    packed = np.concatenate(raw) if comm.rank == root else \
        np.empty(sum(r.nbytes for r in raw), dtype=np.uint8)
    comm.broadcast(packed, root=root, out=packed)
    start = 0
    for t, r in zip(tensors, raw):
        a = _data(t)
        piece = packed[start:start + r.nbytes].view(a._np_dtype).reshape(a.shape)
        start += r.nbytes
        t.cached_data = NDArray(piece, device=a.device, dtype=a.dtype)


def replicate_from_rank0(module: Module, comm: Comm, what: str) -> None:
    """Check that all ranks hold the same parameter/buffer shapes, then copy rank 0's values."""
    named = list(module.named_parameters()) + list(module.named_buffers())
    check_same_shapes(comm, named, what)
    broadcast_tensors(comm, [t for _, t in named], root=0)

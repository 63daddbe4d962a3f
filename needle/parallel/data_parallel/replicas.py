"""Keeping model replicas in agreement: same shapes on every rank, rank 0's values everywhere.

Every data-parallel strategy starts here (PyTorch's DDP and FSDP ``sync_module_states``):
``check_same_shapes`` compares each rank's list of (name, shape, dtype) and raises the same
``ValueError`` on every rank when they differ, naming the rank, the parameter and both shapes;
``broadcast_tensors`` then copies rank 0's values into every rank's tensors with one broadcast
of their packed bytes.

The helpers below move data between needle tensors and the NumPy buffers that collectives
send: on the CPU a NumPy *view* (no copy) through DLPack, elsewhere a copy through the host.
"""
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ...autograd import Tensor
from ...backend_ndarray import NDArray, cpu
from ...backend_ndarray import dlpack as _dlpack
from ...backend_ndarray.dtypes import to_numpy_dtype

__all__ = ["host_view", "to_tensor", "empty_host", "check_same_shapes", "broadcast_tensors"]

MAX_DIMS = 8
_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32",
           "int64", "bool")


def _data(x: Any) -> NDArray:
    return x.realize_cached_data() if isinstance(x, Tensor) else x


def host_view(x: Any) -> np.ndarray:
    """The data of a Tensor/NDArray as NumPy: a view on the CPU (no copy), else a copy."""
    a = _data(x)
    if a.device.name == "cpu" and a.dtype != "bfloat16":
        return _dlpack.to_dlpack(a)
    return a.numpy()


def to_tensor(arr: np.ndarray, device: Any = None, dtype: Optional[str] = None) -> Tensor:
    """A constant Tensor over ``arr``: shares its memory on the CPU, copied to other devices."""
    device = cpu() if device is None else device
    if dtype is not None and to_numpy_dtype(dtype) != arr.dtype:
        arr = arr.astype(to_numpy_dtype(dtype))
    if device.name == "cpu" and arr.dtype.name != "bfloat16":
        return Tensor.make_const(_dlpack.from_dlpack(arr))
    return Tensor.make_const(NDArray(arr, device=device, dtype=arr.dtype.name))


def empty_host(n: int, dtype: Any) -> Tuple[NDArray, np.ndarray]:
    """A length-``n`` CPU buffer allocated by needle (so ``MemoryTracker`` sees it) and a NumPy
    view of it; keep the NDArray alive as long as the view is used."""
    nd = NDArray.make((int(n),), device=cpu(), dtype=np.dtype(dtype))
    return nd, _dlpack.to_dlpack(nd)


def _describe(shapes: Sequence[Tuple[int, ...]], dtypes: Sequence[str]) -> np.ndarray:
    """One int64 row per tensor: ndim, dims (padded), dtype code."""
    rows = np.zeros((len(shapes), MAX_DIMS + 2), dtype=np.int64)
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        if len(shape) > MAX_DIMS:
            raise ValueError(f"tensors of more than {MAX_DIMS} dimensions are not supported")
        rows[i, 0] = len(shape)
        rows[i, 1:1 + len(shape)] = shape
        rows[i, -1] = _DTYPES.index(dtype) if dtype in _DTYPES else -1
    return rows


def _unpack(row: np.ndarray) -> Tuple[Tuple[int, ...], str]:
    shape = tuple(int(d) for d in row[1:1 + int(row[0])])
    dtype = _DTYPES[int(row[-1])] if row[-1] >= 0 else "other"
    return shape, dtype


def check_same_shapes(comm: Any, named: Sequence[Tuple[str, Any]], what: str) -> None:
    """Raise on every rank unless all ranks hold tensors of equal count, shapes and dtypes.

    ``named`` lists (name, Tensor); ``what`` names the caller in the message.
    """
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


def broadcast_tensors(comm: Any, tensors: Sequence[Tensor], root: int = 0) -> None:
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

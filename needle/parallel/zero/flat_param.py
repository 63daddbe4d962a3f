"""A flat parameter: an FSDP unit's parameters as this rank's 1/N of one flat vector (FSDP, sec.
3.2); full parameters exist only between ``gather`` and the next ``free``."""
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ...autograd import Tensor
from ...backend_ndarray import NDArray
from ...backend_ndarray.dtypes import to_numpy_dtype
from ...nn import Parameter
from ..comm.engine.convert import empty_host, host_view, to_tensor
from ..comm.protocol import Comm
from ..data_parallel.flat_layout import FlatLayout

__all__ = ["FlatParamUnit"]


def _placeholder(shape: Tuple[int, ...], dtype: str, device: Any,
                 cache: Dict[Tuple[str, Any], NDArray]) -> NDArray:
    """A broadcast view of one NaN with ``shape``: the shape stays, the memory goes."""
    key = (dtype, device)
    if key not in cache:
        one = NDArray.make((1,), device=device, dtype=dtype)
        one.fill(float("nan"))
        cache[key] = one
    return cache[key].reshape((1,) * len(shape)).broadcast_to(shape)


class FlatParamUnit(FlatLayout):
    """One FSDP unit: the parameters it owns, its flat shard, and gather / free."""

    def __init__(self, name: str, named: List[Tuple[str, Tensor]], comm: Comm,
                 compute_dtype: Optional[str], shard_device: Any) -> None:
        self.name, self.comm = name, comm
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) > 1:
            raise ValueError(f"FullyShardedDataParallel: unit {name or '(root)'} mixes dtypes "
                             f"{sorted(dtypes)}; one flat parameter holds one dtype (rank "
                             f"{comm.rank})")
        self.dtype = self.params[0].dtype
        self.compute_dtype = compute_dtype or self.dtype
        self.device = self.params[0].device  # where forward and backward compute
        super().__init__([tuple(p.shape) for p in self.params], comm.size)
        full = self.flatten([host_view(p) for p in self.params], to_numpy_dtype(self.dtype))
        mine = self.part(full, comm.rank)
        # The master shard: full precision, on the host with cpu_offload.
        self.shard = Parameter(mine, device=shard_device, dtype=self.dtype)
        self.gathered = False
        self._storage: Any = None
        self.grad_storage: Any = None
        self._placeholders: Dict[Tuple[str, Any], NDArray] = {}
        self.free()

    def full_flat(self) -> np.ndarray:
        """Allgather the shards: the unit's flat vector (padded) as NumPy, on every rank."""
        keep, out = empty_host(self.comm.size * self.cols, to_numpy_dtype(self.dtype))
        self._storage = keep  # gather() points the parameters into it
        return self.comm.allgather(np.ascontiguousarray(host_view(self.shard)), out=out)

    def gather(self) -> None:
        """Materialise the unit's parameters (in the compute dtype) from every rank's shard."""
        if self.gathered:
            return
        flat = self.full_flat()
        for p, view in zip(self.params, self.views(flat)):
            p.cached_data = to_tensor(view, self.device, self.compute_dtype).cached_data
        if self.compute_dtype != self.dtype:
            self._storage = None  # the casts are copies: the gathered buffer can go
        self.gathered = True

    def free(self) -> None:
        """Drop the full parameters (placeholders keep their shapes)."""
        for p, shape in zip(self.params, self.shapes):
            p.cached_data = _placeholder(shape, self.compute_dtype, self.device,
                                         self._placeholders)
        self._storage = None
        self.gathered = False

    def take_grad(self, row: np.ndarray, counts: np.ndarray, storage: Any) -> None:
        """This rank's reduce-scattered (summed) gradient row becomes ``shard.grad`` (average)."""
        data = row[:self.cols]
        data /= self.comm.size
        self.grad_storage = storage
        self.shard.grad = to_tensor(data, self.shard.device, self.shard.dtype) \
            if counts.any() else None

    def unflatten(self, flat: np.ndarray) -> Dict[str, np.ndarray]:
        """name -> array of each parameter, from the unit's full flat vector."""
        return {name: view.copy() for name, view in zip(self.names, self.views(flat))}

    def load_flat(self, values: Dict[str, np.ndarray]) -> None:
        """Set this rank's shard from full per-parameter arrays (same names and shapes)."""
        arrays = [np.asarray(values[name]) for name in self.names]
        for name, value, shape in zip(self.names, arrays, self.shapes):
            if value.shape != shape:
                raise ValueError(f"FullyShardedDataParallel: {name!r} has shape {value.shape} "
                                 f"in the state dict but {shape} in the model (rank "
                                 f"{self.comm.rank})")
        mine = self.part(self.flatten(arrays, to_numpy_dtype(self.dtype)), self.comm.rank)
        self.shard.cached_data = NDArray(mine, device=self.shard.device, dtype=self.dtype)

    def __repr__(self) -> str:
        return (f"FlatParamUnit({self.name or '(root)'}: {len(self.params)} params, "
                f"{self.numel} elements, shard {self.cols})")

"""Data-parallel training: the whole model on every rank, gradients averaged before the step.

N ranks averaging the gradients of their mean losses take exactly the step one process takes
on the concatenated batch (Li et al., "PyTorch Distributed", VLDB 2020, sec. 2). Simplest first:

* ``DataParallelNaive``: after backward, one blocking allreduce per gradient.
* ``DistributedDataParallel``: gradients packed into buckets (``buckets.py``), each allreduced
  asynchronously as soon as it is full, overlapping the rest of backward. ``no_sync()`` skips
  the averaging for gradient accumulation.

Both start from rank 0's parameters and buffers and are used like the module they wrap.
"""
import contextlib
from typing import Any, Callable, Iterator, List, NoReturn, Set

import numpy as np

from ...autograd import Tensor
from ...nn import Module
from ..comm.agree import agree
from ..comm.engine.convert import host_view, to_tensor
from ..comm.engine.metadata import CallMismatchError
from ..comm.protocol import Comm
from .buckets import MB, Bucket, BucketReducer, assign_buckets, reduce_dtype
from .grad_hooks import BackwardHooks
from .replicas import replicate_from_rank0

__all__ = ["DataParallelNaive", "DistributedDataParallel"]


class _DataParallel(Module):
    """What both versions share: the wrapped module, rank 0's start, the hooks' bookkeeping."""

    _on_grad: Callable[[Tensor], None]  # each version's: a gradient arrived ...
    _on_end: Callable[[], None]  # ... and backward ended

    def __init__(self, module: Module, comm: Comm, what: str) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"{what} wraps an nn.Module, got {type(module).__name__}")
        self.module = module
        self.comm = comm
        replicate_from_rank0(module, comm, what)
        # Trained parameters in registration order, each once (tied weights are one tensor).
        self._hooks = BackwardHooks(self._trained(), self._on_grad, self._on_end)

    def _trained(self) -> List[Tensor]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._hooks.interrupted():  # a previous backward raised before its end
            self._restart()
        return self.module(*args, **kwargs)

    def _restart(self) -> None:
        """Forget what a backward that raised left half done."""


class DataParallelNaive(_DataParallel):
    """One blocking allreduce per gradient once backward has finished (Li et al., sec. 3.1)."""

    def __init__(self, module: Module, comm: Comm) -> None:
        self._ready: Set[int] = set()  # ids of the parameters that got a gradient this backward
        super().__init__(module, comm, "DataParallelNaive")

    def _on_grad(self, param: Tensor) -> None:
        self._ready.add(id(param))

    def _restart(self) -> None:
        self._ready.clear()

    def sync_gradients(self) -> None:
        """Average every parameter's gradient over the ranks (run when backward ends)."""
        params = self._trained()
        # How many ranks produced each gradient: 0 means no rank used it (grad stays None).
        used = self.comm.allreduce(np.array([id(p) in self._ready for p in params], np.int64))
        for p, n_used in zip(params, used):
            if n_used == 0:
                continue
            local = host_view(p.grad) if id(p) in self._ready else np.zeros(p.shape, p.dtype)
            p.grad = to_tensor(self.comm.allreduce(local, op="avg"), p.device, p.dtype)
        self._ready.clear()

    _on_end = sync_gradients


class DistributedDataParallel(_DataParallel):
    """Bucketed allreduce overlapped with backward (Li et al., VLDB 2020, sec. 3.2-3.3).

    The first bucket (the last layers' gradients) is capped at ``first_bucket_mb`` so communication
    starts early; ``overlap=False`` launches every bucket after backward. ``p.grad`` is then the
    average, a view into its bucket; parameters no rank used keep None."""

    def __init__(self, module: Module, comm: Comm, bucket_cap_mb: float = 25.0,
                 first_bucket_mb: float = 1.0, overlap: bool = True) -> None:
        for name, cap in (("bucket_cap_mb", bucket_cap_mb), ("first_bucket_mb", first_bucket_mb)):
            if not isinstance(cap, (int, float)) or not cap > 0:
                raise ValueError(f"DistributedDataParallel: {name} must be > 0, got {cap!r} "
                                 f"(rank {comm.rank})")
        agree(comm, "DistributedDataParallel", {"bucket_cap_mb": bucket_cap_mb,
                                                "first_bucket_mb": first_bucket_mb,
                                                "overlap": bool(overlap)})
        self.overlap = overlap
        self._sync = True
        # Backward passes ended under no_sync() since the last sync. Each bucket allreduce
        # passes it (+1) as its ``context``: ranks that disagree on no_sync() then fail the
        # argument check at their first sync, instead of summing different backward passes.
        self._accumulated = 0
        super().__init__(module, comm, "DistributedDataParallel")
        params = self._trained()
        layout = assign_buckets([p.size * np.dtype(reduce_dtype(p.dtype)).itemsize for p in params],
                                [p.dtype for p in params], bucket_cap_mb * MB,
                                first_bucket_mb * MB)
        self.reducer = BucketReducer(params, layout, rows=1, launch=self._allreduce,
                                     dtype_of=reduce_dtype)

    @property
    def buckets(self) -> List[Bucket]:
        """The gradient buckets, in launch order."""
        return self.reducer.buckets

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside keep local gradients (not averaged) and accumulate them; the
        first backward after the block averages the sum of all of them."""
        prev, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = prev

    def _restart(self) -> None:
        self.reducer.reset()  # a sync that raised; the accumulated gradients are dropped too
        self._accumulated = 0

    def _on_grad(self, param: Tensor) -> None:
        self.reducer.add(param, accumulate=True)
        if self._sync and self.overlap:
            try:
                self.reducer.launch_ready()
            except CallMismatchError as err:
                _raise_naming_no_sync(err, self.comm.rank)

    def _allreduce(self, bucket: Bucket) -> Any:
        return self.comm.allreduce_async(bucket.buffer, op="sum", out=bucket.buffer,
                                         context=self._accumulated + 1)

    def _on_end(self) -> None:
        """End of backward: wait for every bucket, then hand out the averaged gradients."""
        if not self._sync:  # no_sync: keep what the buckets accumulated for the next sync
            self.reducer.rearm()
            self._accumulated += 1
            return
        try:
            results = self.reducer.finish()
        except CallMismatchError as err:
            _raise_naming_no_sync(err, self.comm.rank)
        self._accumulated = 0
        for bucket, rows in zip(self.buckets, results):
            counts = rows[0, bucket.cols:].copy()  # how many ranks used each parameter
            rows[:, :bucket.cols] /= self.comm.size
            for slot, p in enumerate(bucket.params):
                if counts[slot] == 0:
                    p.grad = None
                else:
                    grad = bucket.read(slot, rows).reshape(p.shape)
                    p.grad = to_tensor(grad, p.device, p.dtype)


def _raise_naming_no_sync(err: CallMismatchError, rank: int) -> NoReturn:
    """Re-raise a bucket allreduce's mismatch; where the ranks passed different counts of
    accumulated backward passes (their ``context``), as an error naming no_sync()."""
    if len(set(err.contexts)) == 1:  # the same count everywhere: another argument differs
        raise err
    values = ", ".join(f"rank {r} has {n}" for r, n in enumerate(err.contexts))
    raise ValueError(
        f"DistributedDataParallel (rank {rank}): ranks disagree on no_sync(): backward passes "
        f"accumulated at this sync (those under no_sync() and this one): {values}") from err

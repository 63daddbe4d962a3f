"""ZeRO stages 1 and 2: each rank keeps optimizer state (and gradients) for 1/N of the model.

Rajbhandari et al., "ZeRO" (SC 2020), sec. 5.1-5.2; the memory terms are in
``needle/memory/estimator.py``.

* Stage 1 wraps a DDP model (gradients already averaged): each rank updates the pieces it owns
  (``owned_pieces``), then an allgather per bucket. That sends 1.5x DDP's bytes; the paper's
  stage 1 reduce-scatters instead, which is what stage 2 does here.
* Stage 2 takes a plain model: each gradient bucket is reduce-scattered from the hooks as soon
  as it is full, so a rank keeps only its shard; ``step()`` updates it and allgathers.

The inner optimizer runs on 1-D pieces, so it must be elementwise (SGD, Adam, AdamW; not
Adafactor).
"""
import inspect
from typing import Any, Dict, Iterable, List, Sequence, Tuple

import numpy as np

from ...autograd import Tensor
from ...backend_ndarray.dtypes import to_numpy_dtype
from ...optim import SGD, Adam
from ..comm.agree import agree, optimizer_settings
from ..comm.engine.convert import empty_host, host_view, to_tensor
from ..comm.protocol import Comm
from ..data_parallel.buckets import (
    MB,
    Bucket,
    BucketReducer,
    assign_buckets,
    reduce_scatter_bucket,
)
from ..data_parallel.flat_layout import FlatLayout, owned_pieces
from ..data_parallel.grad_hooks import BackwardHooks
from ..data_parallel.replicas import broadcast_tensors, check_same_shapes

__all__ = ["ZeroRedundancyOptimizer"]


def _param_groups(params: Any) -> List[Tuple[List[Tensor], Dict[str, Any]]]:
    """``params`` as (tensors, options) groups: a list of Tensors is one group without options."""
    items = list(params)
    if items and all(isinstance(g, dict) for g in items):
        groups = []
        for i, g in enumerate(items):
            if "params" not in g:
                raise ValueError(f"param group {i} has no 'params' key")
            groups.append((list(g["params"]), {k: v for k, v in g.items() if k != "params"}))
        return groups
    return [(items, {})]


def _check_optimizer(cls: type, groups: Sequence[Tuple[list, dict]], defaults: Dict[str, Any],
                     rank: int) -> None:
    """The inner optimizer must be elementwise and accept every option given to it."""
    if not isinstance(cls, type):
        raise TypeError(f"ZeroRedundancyOptimizer: optimizer_class must be a class, got {cls!r}")
    if not getattr(cls, "elementwise", issubclass(cls, (SGD, Adam))):
        raise ValueError(f"ZeroRedundancyOptimizer: {cls.__name__} does not update elements "
                         "independently, so it cannot run on flat shards (use SGD, Adam, AdamW, "
                         "or set elementwise = True on an optimizer class that does)")
    sig = inspect.signature(cls)  # the constructor's parameters, without self
    takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    accepted = [n for n in sig.parameters if n not in ("self", "params")]
    options = [("the defaults", defaults)] + [(f"param group {i}", g) for i, (_, g) in
                                               enumerate(groups)]
    for where, opts in options:
        for key in opts:
            if not takes_any and key not in accepted:
                raise ValueError(f"ZeroRedundancyOptimizer (rank {rank}): {where} sets {key!r}, "
                                 f"which {cls.__name__} does not accept (it takes "
                                 f"{', '.join(accepted)})")
    for i, (tensors, _) in enumerate(groups):
        for j, t in enumerate(tensors):
            if not isinstance(t, Tensor):
                raise TypeError(f"ZeroRedundancyOptimizer (rank {rank}): param group {i} item "
                                f"{j} is a {type(t).__name__}, not a Tensor")


class _ShardedBucket(FlatLayout):
    """One bucket of parameters and the pieces of them this rank owns."""

    def __init__(self, params: List[Tensor], world: int, rank: int) -> None:
        self.params = params
        super().__init__([tuple(p.shape) for p in params], world)
        self.pieces = owned_pieces(self.sizes, world, rank)
        # Each piece is a 1-D Tensor the inner optimizer updates; it starts as a view of its
        # parameter's elements, and after each step a view of the gathered parameters.
        self.param_storage: Any = None  # the gathered buffer the parameters are views of
        self.grad_storage: Any = None  # stage 2: the buffer my pieces' gradients are views of
        self.tensors = [to_tensor(host_view(params[pc.slot]).reshape(-1)
                                  [pc.start:pc.start + pc.length], params[pc.slot].device)
                        for pc in self.pieces]


class ZeroRedundancyOptimizer:
    """``optimizer_class`` over this rank's shard; stage 1 (state) or stage 2 (state + grads)."""

    def __init__(self, params: Iterable[Any], optimizer_class: type, comm: Comm, stage: int = 1,
                 bucket_cap_mb: float = 25.0, **defaults: Any) -> None:
        if stage not in (1, 2):
            raise ValueError(f"ZeroRedundancyOptimizer: stage must be 1 or 2 (rank {comm.rank}); "
                             "stage 3 is FullyShardedDataParallel")
        if not bucket_cap_mb > 0:
            raise ValueError(f"ZeroRedundancyOptimizer: bucket_cap_mb must be > 0, got "
                             f"{bucket_cap_mb!r} (rank {comm.rank})")
        groups = _param_groups(params)
        _check_optimizer(optimizer_class, groups, defaults, comm.rank)
        agree(comm, "ZeroRedundancyOptimizer", dict(
            {"stage": stage, "bucket_cap_mb": bucket_cap_mb, "param_groups": len(groups)},
            **optimizer_settings((optimizer_class, defaults))))
        self.comm, self.stage = comm, stage
        group_of: Dict[int, int] = {}
        self.params: List[Tensor] = []
        for g, (tensors, _) in enumerate(groups):
            for p in tensors:
                if p.requires_grad and id(p) not in group_of:  # tied weights once
                    group_of[id(p)] = g
                    self.params.append(p)
        check_same_shapes(comm, [(f"param {i}", p) for i, p in enumerate(self.params)],
                          "ZeroRedundancyOptimizer")
        broadcast_tensors(comm, self.params)  # stage 2 wraps a plain model: start from rank 0
        layout = assign_buckets([p.size * np.dtype(to_numpy_dtype(p.dtype)).itemsize
                                 for p in self.params], [p.dtype for p in self.params],
                                bucket_cap_mb * MB, bucket_cap_mb * MB)
        self.buckets = [_ShardedBucket([self.params[i] for i in idx], comm.size, comm.rank)
                        for idx in layout]
        self.optimizers = []
        for g, (_, opts) in enumerate(groups):
            mine = [t for b in self.buckets for pc, t in zip(b.pieces, b.tensors)
                    if group_of[id(b.params[pc.slot])] == g]
            self.optimizers.append(optimizer_class(mine, **{**defaults, **opts}))
        if stage == 2:
            self.reducer = BucketReducer(self.params, layout, rows=comm.size,
                                         launch=self._reduce_scatter, on_done=self._take_shard)
            self._sharded = {id(b): sb for b, sb in zip(self.reducer.buckets, self.buckets)}
            self._hooks = BackwardHooks(self.params, self._on_grad, self._finish)

    # -- gradients -----------------------------------------------------------------------
    def _on_grad(self, param: Tensor) -> None:
        """Stage 2: the gradient goes into its bucket and the full-size ``.grad`` is dropped."""
        self.reducer.add(param)
        param.grad = None
        self.reducer.launch_ready()

    def _reduce_scatter(self, bucket: Bucket) -> Any:
        work = reduce_scatter_bucket(self.comm, bucket)
        self._sharded[id(bucket)].grad_storage = bucket.received
        return work

    def _take_shard(self, bucket: Bucket, row: np.ndarray) -> None:
        """A bucket's reduce-scatter finished: my averaged rows become my pieces' gradients."""
        sb = self._sharded[id(bucket)]
        counts = row[0, bucket.cols:]
        data = row[0, :bucket.cols]
        data /= self.comm.size
        for pc, t in zip(sb.pieces, sb.tensors):
            t.grad = None if counts[pc.slot] == 0 else \
                to_tensor(data[pc.at:pc.at + pc.length], t.device, t.dtype)
        bucket.release()

    def _finish(self) -> None:
        self.reducer.finish()

    def _grads_from_params(self) -> None:
        """Stage 1: my pieces' gradients are slices of the (DDP-averaged) full gradients."""
        for b in self.buckets:
            for pc, t in zip(b.pieces, b.tensors):
                g = b.params[pc.slot].grad
                t.grad = None if g is None else \
                    to_tensor(host_view(g).reshape(-1)[pc.start:pc.start + pc.length], t.device,
                              t.dtype)

    # -- the step --------------------------------------------------------------------------
    def step(self) -> None:
        """Update this rank's pieces, then allgather every bucket's updated parameters."""
        if self.stage == 1:
            self._grads_from_params()
        for opt in self.optimizers:
            opt.step()
        works = [self._allgather(b) for b in self.buckets]
        for b, (work, storage) in zip(self.buckets, works):
            b.param_storage = storage  # the parameters are views of it from now on
            self._scatter_params(b, work.wait())

    def _allgather(self, b: _ShardedBucket) -> Tuple[Any, Any]:
        dtype = to_numpy_dtype(b.params[0].dtype)
        _, send = empty_host(b.cols, dtype)
        send[...] = 0
        for pc, t in zip(b.pieces, b.tensors):
            send[pc.at:pc.at + pc.length] = host_view(t)
        keep, out = empty_host(self.comm.size * b.cols, dtype)
        return self.comm.allgather_async(send, out=out), keep

    def _scatter_params(self, b: _ShardedBucket, gathered: np.ndarray) -> None:
        """Point every parameter (and my pieces) at the gathered flat buffer: no copies."""
        for p, view in zip(b.params, b.views(gathered)):
            p.cached_data = to_tensor(view, p.device, p.dtype).cached_data
        base = self.comm.rank * b.cols
        for pc, t in zip(b.pieces, b.tensors):
            t.cached_data = to_tensor(gathered[base + pc.at:base + pc.at + pc.length],
                                      t.device, t.dtype).cached_data

    def reset_grad(self) -> None:
        """Drop the full gradients and this rank's shard gradients (stage 2: and what a
        backward that raised left in the buckets, as DDP's and FSDP's next forward do)."""
        if self.stage == 2 and self._hooks.interrupted():
            self.reducer.reset()
        for p in self.params:
            p.grad = None
        for opt in self.optimizers:
            opt.reset_grad()

    zero_grad = reset_grad

    @property
    def shard_numel(self) -> int:
        """Elements of the model this rank updates (its share of Psi, padding excluded)."""
        return sum(pc.length for b in self.buckets for pc in b.pieces)

    def state_dict(self) -> Dict[str, Any]:
        """This rank's optimizer state (save one file per rank; reload on the same layout)."""
        return {"rank": self.comm.rank, "world_size": self.comm.size, "stage": self.stage,
                "pieces": self._pieces(), "optimizers": [o.state_dict() for o in self.optimizers]}

    def _pieces(self) -> List[int]:
        """The sizes of this rank's pieces, in order: the layout its optimizer state is in."""
        return [pc.length for b in self.buckets for pc in b.pieces]

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore ``state_dict()`` saved by the same rank of a job of the same size."""
        if state.get("world_size") != self.comm.size or state.get("rank") != self.comm.rank:
            raise ValueError(f"ZeroRedundancyOptimizer (rank {self.comm.rank}): state saved by "
                             f"rank {state.get('rank')} of {state.get('world_size')}, this is "
                             f"rank {self.comm.rank} of {self.comm.size}")
        saved = state.get("optimizers", [])
        pieces = [int(n) for n in state.get("pieces", [])]
        if state.get("stage") != self.stage or len(saved) != len(self.optimizers) or \
                pieces != self._pieces():
            raise ValueError(f"ZeroRedundancyOptimizer (rank {self.comm.rank}): state saved at "
                             f"stage {state.get('stage')} with {len(saved)} optimizers over "
                             f"pieces of {pieces[:8]}... elements, this is stage {self.stage} "
                             f"with {len(self.optimizers)} over {self._pieces()[:8]}... (another "
                             "bucket size or parameter groups?)")
        for opt, s in zip(self.optimizers, saved):
            opt.load_state_dict(s)

    def __repr__(self) -> str:
        inner = type(self.optimizers[0]).__name__ if self.optimizers else "?"
        return (f"ZeroRedundancyOptimizer(stage={self.stage}, {inner}, rank {self.comm.rank} of "
                f"{self.comm.size}, {self.shard_numel} of "
                f"{sum(b.numel for b in self.buckets)} elements)")

"""Fully sharded data parallelism (ZeRO stage 3): each unit's parameters exist in full only
while that unit computes.

Zhao et al., "PyTorch FSDP" (VLDB 2023), sec. 3; Rajbhandari et al., "ZeRO" (SC 2020), sec. 5.3.
Units are the model's direct children plus a root unit for the rest (tied weights included):

    forward:  allgather its shards -> run the unit -> free the full parameters
    backward: allgather again -> the unit's gradients -> free -> reduce-scatter (async)

2 allgathers + 1 reduce-scatter: 1.5x a ring allreduce's bytes (paper, sec. 7).
``parameters()`` are the flat shards, so any optimizer works on them. Mixed precision keeps the
shards in the parameters' dtype (the master) and computes in bf16/fp16, reducing in fp32;
``cpu_offload=True`` keeps shards and optimizer state on the CPU. A parameter no rank used gets
a zero gradient (its unit's shard has one gradient).
"""
import functools
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ... import autograd
from ...autograd import Tensor
from ...backend_ndarray import cpu
from ...backend_ndarray.dtypes import FLOATS
from ...nn import Module, Parameter
from ..comm.agree import agree
from ..comm.protocol import Comm
from ..data_parallel.buckets import Bucket, BucketReducer, reduce_dtype, reduce_scatter_bucket
from ..data_parallel.grad_hooks import BackwardHooks
from ..data_parallel.replicas import replicate_from_rank0
from . import fsdp_checkpoint
from .flat_param import FlatParamUnit

__all__ = ["FullyShardedDataParallel"]

PRECISIONS = {None: None, "bf16": "bfloat16", "fp16": "float16"}


class FullyShardedDataParallel(Module):
    """ZeRO-3 / FSDP: wrap ``module``; train ``fsdp.parameters()`` (this rank's flat shards)."""

    def __init__(self, module: Module, comm: Comm, mixed_precision: Optional[str] = None,
                 cpu_offload: bool = False, units: Optional[Sequence[Module]] = None) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"FullyShardedDataParallel wraps an nn.Module, got "
                            f"{type(module).__name__} (rank {comm.rank})")
        if mixed_precision not in PRECISIONS:
            raise ValueError(f"FullyShardedDataParallel: mixed_precision must be None, 'bf16' "
                             f"or 'fp16', got {mixed_precision!r} (rank {comm.rank})")
        agree(comm, "FullyShardedDataParallel", {
            "mixed_precision": mixed_precision, "cpu_offload": bool(cpu_offload),
            "units": None if units is None else len(units)})
        self.module, self.comm = module, comm
        self.mixed_precision, self.cpu_offload = mixed_precision, cpu_offload
        replicate_from_rank0(module, comm, "FullyShardedDataParallel")
        owners = self._assign_units(module, units)
        self.units: List[FlatParamUnit] = []  # the flat-parameter units, root first
        self._root: Optional[FlatParamUnit] = None
        wrapped = []
        for unit_module, unit_name, named in owners:
            if named:
                unit = FlatParamUnit(unit_name, named, comm, PRECISIONS[mixed_precision],
                                     cpu() if cpu_offload else named[0][1].device)
                self.units.append(unit)
                if unit_module is module:
                    self._root = unit
                else:
                    wrapped.append((unit, unit_module))
        params = [p for u in self.units for p in u.params]
        index = {id(p): i for i, p in enumerate(params)}
        layout = [[index[id(p)] for p in u.params] for u in reversed(self.units)]
        self._reducer = BucketReducer(params, layout, rows=comm.size,
                                      launch=functools.partial(reduce_scatter_bucket, comm),
                                      dtype_of=reduce_dtype, on_done=self._take_grad)
        self._unit_of_bucket = {id(b): u for b, u in zip(self._reducer.buckets,
                                                         reversed(self.units))}
        self._hooks = BackwardHooks(params, self._on_grad, self._finish)
        for unit, unit_module in wrapped:  # an instance attribute shadows the class's forward
            unit_module.forward = functools.partial(self._run_unit, unit, unit_module.forward)

    # -- which unit owns which parameter -----------------------------------------------------
    @staticmethod
    def _assign_units(module: Module, units: Optional[Sequence[Module]]
                      ) -> List[Tuple[Module, str, List[Tuple[str, Tensor]]]]:
        """(unit module, its name, the trained parameters it owns), the root first."""
        names = {id(m): n for n, m in module.named_modules()}
        chosen = list(units) if units is not None else [m for _, m in module.named_children()]
        for m in chosen:
            if id(m) not in names or m is module:
                raise ValueError("FullyShardedDataParallel: units must be submodules of the "
                                 "wrapped module (the root unit is implicit)")
        # Which modules hold each parameter as their own attribute (two for a tied weight).
        holders: Dict[int, List[int]] = {}
        for _, m in module.named_modules():
            for _, value in m._items():
                if isinstance(value, Parameter):
                    holders.setdefault(id(value), []).append(id(m))
        chosen = [module] + chosen  # the root unit, the largest: it fits when no other does
        subtrees = [{id(x) for _, x in m.named_modules()} for m in chosen]
        owned: List[List[Tuple[str, Tensor]]] = [[] for _ in chosen]
        for name, p in module.named_parameters():
            if p.requires_grad:  # frozen: stays whole on every rank
                # The innermost unit that contains every module using p.
                fits = [k for k, sub in enumerate(subtrees)
                        if all(h in sub for h in holders.get(id(p), []))]
                owned[min(fits, key=lambda k: len(subtrees[k]))].append((name, p))
        return [(m, names[id(m)], o) for m, o in zip(chosen, owned)]

    # -- forward -------------------------------------------------------------------------
    def _run_unit(self, unit: FlatParamUnit, forward: Any, *args: Any, **kwargs: Any) -> Any:
        unit.gather()
        out = forward(*args, **kwargs)
        if autograd.is_grad_enabled():
            fired: List[bool] = []

            def before_backward(grad: Tensor) -> None:
                if not fired:  # several outputs: gather once
                    fired.append(True)
                    unit.gather()
            for t in _tensors(out):
                if t.requires_grad:
                    t.register_hook(before_backward)
        unit.free()
        return out

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._hooks.interrupted():  # a previous backward raised before its end
            self._reducer.reset()
        compute = PRECISIONS[self.mixed_precision]
        if compute is not None:  # inputs in the compute dtype too (PyTorch: cast_forward_inputs)
            args = tuple(_cast(a, compute) for a in args)
            kwargs = {k: _cast(v, compute) for k, v in kwargs.items()}
        if self._root is None:
            return self.module(*args, **kwargs)
        return self._run_unit(self._root, self.module.forward, *args, **kwargs)

    # -- backward ------------------------------------------------------------------------
    def _on_grad(self, param: Tensor) -> None:
        full = self._reducer.add(param)
        param.grad = None  # only the shard's gradient is kept
        if full is not None:
            self._unit_of_bucket[id(full)].free()
        self._reducer.launch_ready()

    def _take_grad(self, bucket: Bucket, row: np.ndarray) -> None:
        unit = self._unit_of_bucket[id(bucket)]
        unit.take_grad(row[0], row[0, bucket.cols:], bucket.received)
        bucket.release()

    def _finish(self) -> None:
        self._reducer.finish()
        for unit in self.units:
            unit.free()  # units gathered for backward whose gradients never came

    # -- parameters and state ------------------------------------------------------------
    def named_parameters(self) -> Iterator[Tuple[str, Parameter]]:
        """This rank's flat shards, one per unit (what the optimizer trains)."""
        for unit in self.units:
            yield (unit.name + "." if unit.name else "") + "flat_shard", unit.shard

    def full_state_dict(self) -> Dict[str, np.ndarray]:
        """The whole model's state dict (plain model's keys) on every rank (collective)."""
        return fsdp_checkpoint.full_state_dict(self)

    state_dict = full_state_dict

    def load_state_dict(self, state_dict: Dict[str, Any], strict: bool = True) -> Any:
        """Load a plain model's state dict: each rank keeps its shard of it."""
        return fsdp_checkpoint.load_full_state_dict(self, state_dict, strict)

    def save_sharded(self, directory: str, optimizer: Any = None) -> None:
        """Each rank writes its shards (and optimizer state); rank 0 writes the index."""
        fsdp_checkpoint.save_sharded(self, directory, optimizer)

    def load_sharded(self, directory: str, optimizer: Any = None) -> None:
        """Reload ``save_sharded`` output (the same world size and units)."""
        fsdp_checkpoint.load_sharded(self, directory, optimizer)

    def extra_repr(self) -> str:
        return (f"{len(self.units)} units, rank {self.comm.rank} of {self.comm.size}, "
                f"mixed_precision={self.mixed_precision}, cpu_offload={self.cpu_offload}")


def _cast(x: Any, dtype: str) -> Any:
    """Floating-point Tensors to ``dtype``; anything else unchanged."""
    if isinstance(x, Tensor) and x.dtype in FLOATS and x.dtype != dtype:
        return x.astype(dtype)
    return x


def _tensors(out: Any) -> List[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []

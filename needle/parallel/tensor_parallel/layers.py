"""Megatron's parallel layers: column- and row-parallel Linear, vocab-parallel Embedding.

Shoeybi et al., "Megatron-LM", arXiv:1909.08053, sec. 3. Each layer draws the FULL weight
exactly as the serial ``nn.Linear`` / ``nn.Embedding`` would (same init call and RNG draws) and
keeps its shard: built with the same seed, a tensor-parallel model is the serial model, sliced.

Under sequence parallelism (Korthikanti et al., arXiv:2205.05198) parameters applied to
sequence shards (the row layer's bias, LayerNorms) hold partial gradients: they are marked
``sequence_parallel = True`` and ``allreduce_sequence_parallel_grads`` sums them.

Ranks must agree on each call's input: checked as docs/reliability.md, "Inputs", tells.
"""
from typing import Any, Dict, List, Optional

import numpy as np

from ... import init, numbers, ops
from ...autograd import Tensor, Value
from ...nn.nn_basic import Linear
from ...nn.nn_module import Module, Parameter
from ..comm.agree import agree
from ..comm.protocol import Comm
from ..input_agreement import agree_inputs, checksum, disagreement
from ..inputs import check_device, check_indices, check_split, check_width, on_rank
from .tp_comms import (
    chunk,
    copy_to_region,
    gather_from_region,
    gather_from_sequence_region,
    reduce_from_region,
    reduce_scatter_to_sequence_region,
    scatter_to_region,
)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "divide", "agreed_sizes", "allreduce_sequence_parallel_grads"]


def agreed_sizes(what: str, comm: Comm, sizes: Dict[str, Any], **settings: Any) -> List[int]:
    """Each of ``sizes`` as a whole number >= 1, or an error naming it and this rank (before
    ``divide`` could call 4.5 "not divisible"); then every rank agrees on them and ``settings``."""
    out = [numbers.count_arg(v, f"{what}{on_rank(comm)}: {k}", lo=1) for k, v in sizes.items()]
    agree(comm, what, dict(zip(sizes, out), **settings))
    return out


def divide(n: int, p: int, what: str) -> int:
    """n // p, or a ValueError naming both numbers when p does not divide n."""
    if n % p:
        raise ValueError(f"{what} = {n} is not divisible by the tensor-parallel size {p}")
    return n // p


def _shard(full: Tensor, axis: int, rank: int, parts: int, **kw: Any) -> Parameter:
    """This rank's equal slice of ``full`` along ``axis``, as a fresh Parameter."""
    param = Parameter(np.ascontiguousarray(chunk(full.numpy(), axis, rank, parts)), **kw)
    param.tp_axis = axis  # type: ignore[attr-defined]  # the split axis (for checkpoints)
    return param


def forget(*nodes: Value) -> None:
    """Drop the data of graph nodes; backward recomputes it on demand (arXiv:2205.05198, sec.
    4.2.2: only the 1/t shard of an all-gathered input is kept)."""
    for n in nodes:
        n.cached_data = None


def _matmul(x: Tensor, w: Tensor) -> Tensor:
    """(..., in) @ (in, out) -> (..., out)."""
    lead = tuple(x.shape[:-1])
    y = x.reshape((int(np.prod(lead)), x.shape[-1])) @ w
    return y.reshape(lead + (w.shape[1],))


class ColumnParallelLinear(Module):
    """Y_r = X A_r + b_r: this rank's columns of a Linear (arXiv:1909.08053, eq. 3)."""

    def __init__(self, in_features: int, out_features: int, comm: Comm, bias: bool = True,
                 gather_output: bool = False, sequence_parallel: bool = False,
                 recompute_gather: bool = False, device: Optional[Any] = None,
                 dtype: str = "float32") -> None:
        super().__init__()
        p, r = comm.size, comm.rank
        in_features, out_features = agreed_sizes(
            "ColumnParallelLinear", comm, dict(in_features=in_features, out_features=out_features),
            bias=bias, gather_output=gather_output, sequence_parallel=sequence_parallel,
            recompute_gather=recompute_gather, dtype=dtype)
        self.comm, self.in_features, self.out_features = comm, in_features, out_features
        self.out_per_rank = divide(out_features, p, "ColumnParallelLinear out_features")
        self.gather_output, self.sequence_parallel = gather_output, sequence_parallel
        self.recompute_gather = recompute_gather
        kw: Dict[str, Any] = dict(device=device, dtype=dtype)
        # the serial nn.Linear's own draws (hw2.nn.linear), then this rank's columns of them
        full = Linear(in_features, out_features, bias=bias, **kw)
        self.weight = _shard(full.weight, 1, r, p, **kw)
        self.bias = None if full.bias is None else _shard(full.bias, 1, r, p, **kw)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., in) replicated (or (B, T/p, in) under SP) -> (..., out/p) (or out)."""
        what = f"ColumnParallelLinear({self.in_features}, {self.out_features})"
        # under SP the input is (B, T/p, in) and is gathered along axis 1
        ndim = 3 if self.sequence_parallel else None
        check_width(x.shape, self.in_features, self.comm, what, ndim)
        check_device(x, self.weight, self.comm, what)
        with disagreement(self.comm, what):  # e.g. sequence shards of unequal length
            return self._forward(x)

    def _forward(self, x: Tensor) -> Tensor:
        if self.sequence_parallel:
            x = gather_from_sequence_region(x, self.comm)            # (B, T, in)
        else:
            x = copy_to_region(x, self.comm)
        lead = tuple(x.shape[:-1])
        x2 = x.reshape((int(np.prod(lead)), x.shape[-1]))
        y = (x2 @ self.weight).reshape(lead + (self.out_per_rank,))  # (..., out/p)
        if self.sequence_parallel and self.recompute_gather:
            forget(x, x2)                                            # keep only the shard
        if self.bias is not None:
            y = y + self.bias.reshape((1,) * (y.ndim - 1) + (self.out_per_rank,)).broadcast_to(
                y.shape)
        return gather_from_region(y, self.comm) if self.gather_output else y


class RowParallelLinear(Module):
    """Y = sum_r X_r A_r + b: this rank's rows of a Linear (arXiv:1909.08053, eq. 3)."""

    def __init__(self, in_features: int, out_features: int, comm: Comm, bias: bool = True,
                 input_is_parallel: bool = True, sequence_parallel: bool = False,
                 device: Optional[Any] = None, dtype: str = "float32") -> None:
        super().__init__()
        p, r = comm.size, comm.rank
        in_features, out_features = agreed_sizes(
            "RowParallelLinear", comm, dict(in_features=in_features, out_features=out_features),
            bias=bias, input_is_parallel=input_is_parallel, sequence_parallel=sequence_parallel,
            dtype=dtype)
        self.comm, self.in_features, self.out_features = comm, in_features, out_features
        self.in_per_rank = divide(in_features, p, "RowParallelLinear in_features")
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel
        kw: Dict[str, Any] = dict(device=device, dtype=dtype)
        full = Linear(in_features, out_features, bias=bias, **kw)  # the serial layer's draws
        self.weight = _shard(full.weight, 0, r, p, **kw)
        self.bias = None
        if full.bias is not None:  # replicated, added once after the reduction
            self.bias = Parameter(full.bias.numpy(), **kw)
            self.bias.sequence_parallel = sequence_parallel  # type: ignore[attr-defined]

    def forward(self, x: Tensor) -> Tensor:
        """x (..., in/p) (or (..., in) with input_is_parallel=False) -> (..., out)."""
        what = f"RowParallelLinear({self.in_features}, {self.out_features})"
        width = self.in_per_rank if self.input_is_parallel else self.in_features
        check_width(x.shape, width, self.comm, what, 3 if self.sequence_parallel else None)
        check_device(x, self.weight, self.comm, what)
        if self.sequence_parallel:  # the output is reduce-scattered along the sequence
            check_split(x.shape, 1, self.comm, what, "the sequence axis 1")
        with disagreement(self.comm, what):  # e.g. another batch or sequence length
            return self._forward(x)

    def _forward(self, x: Tensor) -> Tensor:
        if not self.input_is_parallel:
            x = scatter_to_region(x, self.comm)
        partial = _matmul(x, self.weight)                            # (..., out), partial sum
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_region(partial, self.comm)  # (B, T/p, out)
        else:
            y = reduce_from_region(partial, self.comm)
        if self.bias is not None:
            y = y + self.bias.reshape((1,) * (y.ndim - 1) + (self.out_features,)).broadcast_to(
                y.shape)
        return y


class VocabParallelEmbedding(Module):
    """An embedding whose vocabulary rows are split across ranks (arXiv:1909.08053, sec. 3)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, comm: Comm,
                 sequence_parallel: bool = False, device: Optional[Any] = None,
                 dtype: str = "float32") -> None:
        super().__init__()
        p, r = comm.size, comm.rank
        num_embeddings, embedding_dim = agreed_sizes(
            "VocabParallelEmbedding", comm, dict(num_embeddings=num_embeddings,
                                                 embedding_dim=embedding_dim),
            sequence_parallel=sequence_parallel, dtype=dtype)
        self.comm, self.num_embeddings, self.embedding_dim = comm, num_embeddings, embedding_dim
        rows = divide(num_embeddings, p, "VocabParallelEmbedding num_embeddings")
        self.start, self.end = r * rows, (r + 1) * rows
        self.sequence_parallel = sequence_parallel
        kw: Dict[str, Any] = dict(device=device, dtype=dtype)
        self.weight = _shard(init.randn(num_embeddings, embedding_dim, **kw), 0, r, p, **kw)

    def forward(self, idx: Any) -> Tensor:
        """Integer indices of any shape (B, T, ...) -> (..., embedding_dim), replicated (or
        sequence-sharded along axis 1 under SP)."""
        what = f"VocabParallelEmbedding({self.num_embeddings}, {self.embedding_dim})"
        # an index no rank owns would otherwise embed to zeros, silently
        ids = check_indices(idx, self.num_embeddings, self.comm, what)
        if self.sequence_parallel:  # the output is reduce-scattered along the sequence
            check_split(ids.shape, 1, self.comm, what, "the sequence axis 1")
            # every rank must look up the same ids: checked with one allgather of an int64
            agree_inputs(self.comm, what, {"ids (CRC-32)": checksum(ids)}, "emb.agree")
        outside = (ids < self.start) | (ids >= self.end)
        local = np.where(outside, 0, ids - self.start)
        emb = ops.embedding(self.weight, local)                      # (..., D)
        keep = Tensor((~outside).astype(np.float64)[..., None], device=emb.device,
                      dtype=emb.dtype, requires_grad=False)
        emb = emb * keep.broadcast_to(emb.shape)                     # rows owned elsewhere: 0
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_region(emb, self.comm)
        # ... or, without SP, by the allreduce's argument check, at no extra message
        with disagreement(self.comm, what, ["ids (CRC-32)"], [32]):
            return reduce_from_region(emb, self.comm, context=checksum(ids))


def allreduce_sequence_parallel_grads(module: Module, comm: Comm) -> None:
    """Sum over the tp group the gradients of parameters marked ``sequence_parallel``."""
    for p in module.parameters():
        if getattr(p, "sequence_parallel", False) and p.grad is not None:
            total = comm.allreduce(p.grad.numpy(), label="sp.param_grads")
            p.grad = Tensor(total, device=p.device, dtype=p.dtype, requires_grad=False)

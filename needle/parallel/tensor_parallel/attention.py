"""Self-attention with its heads split across the tensor-parallel ranks (Megatron-LM, Fig. 3b),
mirroring ``nn.AttentionLayer``; its three LayerNorm outputs pass ONE ``f`` each way."""
from typing import Any, Dict, Optional

from ... import ops
from ...autograd import Tensor
from ...nn.nn_basic import LayerNorm1d
from ...nn.nn_module import Module
from ...nn.nn_transformer import MultiHeadAttention
from ..comm.protocol import Comm
from ..input_agreement import disagreement
from ..inputs import check_device, check_width
from .layers import ColumnParallelLinear, RowParallelLinear, agreed_sizes, divide, forget
from .tp_comms import copy_to_region, gather_from_sequence_region

__all__ = ["ParallelSelfAttention"]


class ParallelSelfAttention(Module):
    """needle's pre-norm ``AttentionLayer`` (self-attention) with heads split over ``comm``."""

    def __init__(self, q_features: int, num_head: int, dim_head: int, comm: Comm, *,
                 causal: bool = True, sequence_parallel: bool = False,
                 recompute_gather: bool = False, device: Optional[Any] = None,
                 dtype: str = "float32") -> None:
        super().__init__()
        q_features, num_head, dim_head = agreed_sizes(
            "ParallelSelfAttention", comm, dict(q_features=q_features, num_head=num_head,
                                                dim_head=dim_head),
            causal=causal, sequence_parallel=sequence_parallel,
            recompute_gather=recompute_gather, dtype=dtype)
        self.comm, self.q_features, self.dim_head = comm, q_features, dim_head
        self.heads_per_rank = divide(num_head, comm.size, "ParallelSelfAttention num_head")
        self.sequence_parallel = sequence_parallel
        self.recompute_gather = sequence_parallel and recompute_gather
        kw: Dict[str, Any] = dict(device=device, dtype=dtype)
        self.prenorm_q = LayerNorm1d(q_features, fused=True, **kw)
        self.prenorm_k = LayerNorm1d(q_features, fused=True, **kw)
        self.prenorm_v = LayerNorm1d(q_features, fused=True, **kw)
        for norm in (self.prenorm_q, self.prenorm_k, self.prenorm_v):
            for q in (norm.weight, norm.bias):
                q.sequence_parallel = sequence_parallel  # type: ignore[attr-defined]
        inner = num_head * dim_head
        # same draws, same order as the serial layer: q, k, v projections, then the output
        self.q_projection = ColumnParallelLinear(q_features, inner, comm, bias=False, **kw)
        self.k_projection = ColumnParallelLinear(q_features, inner, comm, bias=False, **kw)
        self.v_projection = ColumnParallelLinear(q_features, inner, comm, bias=False, **kw)
        self.attn = MultiHeadAttention(causal=causal, **kw)
        self.out_projection = RowParallelLinear(inner, q_features, comm, bias=False,
                                                sequence_parallel=sequence_parallel, **kw)

    def _heads(self, x: Tensor, proj: ColumnParallelLinear) -> Tensor:
        b, t, f = x.shape
        x2 = x.reshape((b * t, f))
        y = x2 @ proj.weight                                         # (B*T, nh/p * hs)
        if self.recompute_gather:
            forget(x, x2)
        y = y.reshape((b, t, self.heads_per_rank, self.dim_head))
        return y.transpose((1, 2))                                   # (B, nh/p, T, hs)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, D) replicated, or (B, T/p, D) under SP -> the same layout."""
        what = f"ParallelSelfAttention({self.q_features})"
        check_width(x.shape, self.q_features, self.comm, what, 3)
        check_device(x, self.prenorm_q.weight, self.comm, what)
        with disagreement(self.comm, what):  # e.g. sequences of unequal length
            return self._forward(x)

    def _forward(self, x: Tensor) -> Tensor:
        b, t, f = x.shape
        flat = x.reshape((b * t, f))
        normed = [n(flat).reshape((b, t, f))
                  for n in (self.prenorm_q, self.prenorm_k, self.prenorm_v)]
        qkv = ops.stack(tuple(normed), 0)                                   # (3, B, T, D)
        if self.sequence_parallel:
            qkv = gather_from_sequence_region(qkv, self.comm, axis=2)  # (3, B, T*p, D)
        else:
            qkv = copy_to_region(qkv, self.comm)
        qkv_parts = ops.split(qkv, 0)
        q, k, v = qkv_parts
        t_full = q.shape[1]
        heads = [self._heads(q, self.q_projection), self._heads(k, self.k_projection),
                 self._heads(v, self.v_projection)]
        if self.recompute_gather:
            forget(qkv, qkv_parts)                                   # only the shard stays
        out, _ = self.attn(*heads)                                   # (B, nh/p, T, hs)
        out = out.transpose((1, 2)).reshape((b, t_full, self.heads_per_rank * self.dim_head))
        return self.out_projection(out)                              # (B, T or T/p, D)

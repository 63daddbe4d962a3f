"""Megatron's MLP and transformer layer, tensor-parallel with optional sequence parallelism;
``ParallelTransformerBlock`` mirrors ``nn.TransformerLayer`` (dropout 0) parameter for parameter."""
from typing import Any, Dict, Optional

from ...autograd import Tensor
from ...nn.nn_basic import LayerNorm1d, ReLU
from ...nn.nn_module import Module
from ..comm.protocol import Comm
from ..inputs import check_width
from .attention import ParallelSelfAttention
from .layers import ColumnParallelLinear, RowParallelLinear

__all__ = ["ParallelMLP", "ParallelTransformerBlock"]


class ParallelMLP(Module):
    """relu(x A_r + a_r) B_r summed over ranks, + b (arXiv:1909.08053, Fig. 3a)."""

    def __init__(self, d_model: int, hidden_size: int, comm: Comm, *,
                 sequence_parallel: bool = False, recompute_gather: bool = False,
                 device: Optional[Any] = None, dtype: str = "float32") -> None:
        super().__init__()
        kw: Dict[str, Any] = dict(device=device, dtype=dtype)
        self.linear1 = ColumnParallelLinear(d_model, hidden_size, comm,
                                            sequence_parallel=sequence_parallel,
                                            recompute_gather=recompute_gather, **kw)
        self.relu = ReLU()
        self.linear2 = RowParallelLinear(hidden_size, d_model, comm,
                                         sequence_parallel=sequence_parallel, **kw)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) (or (B, T/p, D) under SP) -> the same shape."""
        return self.linear2(self.relu(self.linear1(x)))              # (B, T, hidden/p) inside


class ParallelTransformerBlock(Module):
    """needle's pre-norm ``TransformerLayer``: x + attn(x), then x + MLP(LayerNorm(x)).

    ``recompute_gather=True`` (with SP) keeps only sequence shards and all-gathers again in
    backward: activations divided by t for two more all-gathers."""

    def __init__(self, q_features: int, num_head: int, dim_head: int, hidden_size: int,
                 comm: Comm, *, causal: bool = True, sequence_parallel: bool = False,
                 recompute_gather: bool = False, device: Optional[Any] = None,
                 dtype: str = "float32") -> None:
        super().__init__()
        kw: Dict[str, Any] = dict(device=device, dtype=dtype)
        self.comm, self.sequence_parallel = comm, sequence_parallel
        self.attn = ParallelSelfAttention(q_features, num_head, dim_head, comm, causal=causal,
                                          sequence_parallel=sequence_parallel,
                                          recompute_gather=recompute_gather, **kw)
        self.layernorm1 = LayerNorm1d(q_features, fused=True, **kw)
        for q in (self.layernorm1.weight, self.layernorm1.bias):  # partial grads under SP
            q.sequence_parallel = sequence_parallel  # type: ignore[attr-defined]
        self.mlp = ParallelMLP(q_features, hidden_size, comm, sequence_parallel=sequence_parallel,
                               recompute_gather=recompute_gather, **kw)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, D) replicated, or (B, T/p, D) under SP -> the same layout."""
        check_width(x.shape, self.attn.q_features, self.comm, "ParallelTransformerBlock", 3)
        b, t, f = x.shape
        x = x + self.attn(x)
        h = self.layernorm1(x.reshape((b * t, f))).reshape((b, t, f))
        return x + self.mlp(h)

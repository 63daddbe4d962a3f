"""Attention and the pre-norm Transformer (course hw4 extra; Vaswani et al., arXiv:1706.03762).

All heads are computed at once with batched matmuls over (B, heads, T, d) tensors; there is no
Python loop over heads or positions.
"""
import math
from typing import Optional, Tuple

import numpy as np

from .. import init, ops
from ..autograd import Tensor
from ..backend_ndarray import BackendDevice, NDArray
from .nn_basic import Dropout, LayerNorm1d, Linear, ReLU, Sequential
from .nn_module import DeviceDtype, Module
from .nn_sequence import Embedding

__all__ = ["MultiHeadAttention", "AttentionLayer", "TransformerLayer", "Transformer"]


class MultiHeadAttention(Module):
    """softmax(Q K^T / sqrt(d) + mask) V for q, k, v of shape (B, heads, T, d) (eq. 1).

    The mask is ``create_causal_mask`` when ``causal`` (no query attends to a later key),
    else none."""

    def __init__(self, *, dropout: float = 0.0, causal: bool = False,
                 device: Optional[BackendDevice] = None, dtype: str = "float32") -> None:
        super().__init__()
        self.causal = causal
        self.attn_dropout = Dropout(dropout)

    @staticmethod
    def create_causal_mask(i: int, j: int, device: BackendDevice, dtype: str = "float32"
                           ) -> NDArray:
        """(1, 1, i, j) additive mask: a large negative number where key > query position
        (made once per shape and device, ``device.constant``: read it, never write it)."""
        def make() -> np.ndarray:
            big = float(np.finfo(np.dtype(dtype) if dtype != "bfloat16" else np.float32).max)
            return -big * np.triu(np.ones((1, 1, i, j), dtype=np.float64), j - i + 1)
        return device.constant(("causal_mask", i, j, dtype), make, dtype)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
        """Returns (result (B, heads, T_q, d), probs (B, heads, T_q, T_k) after dropout)."""
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or q.shape[-1] != k.shape[-1] or \
                k.shape[:3] != v.shape[:3]:
            raise ValueError(f"MultiHeadAttention expects q, k, v of shape (B, heads, T, d), got "
                             f"{q.shape}, {k.shape}, {v.shape}")
        _, _, q_len, dim = q.shape
        k_len = k.shape[2]
        ### BEGIN YOUR SOLUTION (hw4.nn.transformer)
        logits = (q @ k.transpose()) / math.sqrt(dim)               # (B, nh, Tq, Tk)
        if self.causal:
            mask = self.create_causal_mask(q_len, k_len, q.device, q.dtype)
            logits = logits + Tensor.make_const(mask).broadcast_to(logits.shape)
        probs = self.attn_dropout(ops.softmax(logits, axis=-1))
        return probs @ v, probs                                      # (B, nh, Tq, d)
        ### END YOUR SOLUTION


class AttentionLayer(Module):
    """Pre-norm multi-head attention: LayerNorm, project to heads, attend, project out."""

    def __init__(self, q_features: int, num_head: int, dim_head: int, *,
                 k_features: Optional[int] = None, v_features: Optional[int] = None,
                 out_features: Optional[int] = None, dropout: float = 0.0, causal: bool = True,
                 device: Optional[BackendDevice] = None, dtype: str = "float32") -> None:
        super().__init__()
        k_features = q_features if k_features is None else k_features
        v_features = q_features if v_features is None else v_features
        out_features = q_features if out_features is None else out_features
        self.q_features, self.k_features, self.v_features = q_features, k_features, v_features
        self.out_features = out_features
        self.num_head = num_head
        self.dim_head = dim_head
        kw = DeviceDtype(device=device, dtype=dtype)
        self.prenorm_q = LayerNorm1d(q_features, fused=True, **kw)
        self.prenorm_k = LayerNorm1d(k_features, fused=True, **kw)
        self.prenorm_v = LayerNorm1d(v_features, fused=True, **kw)
        inner = num_head * dim_head
        self.q_projection = Linear(q_features, inner, bias=False, **kw)
        self.k_projection = Linear(k_features, inner, bias=False, **kw)
        self.v_projection = Linear(v_features, inner, bias=False, **kw)
        self.attn = MultiHeadAttention(dropout=dropout, causal=causal, **kw)
        self.out_projection = Linear(inner, out_features, bias=False, **kw)
        self.probs = None

    def _heads(self, x: Tensor, norm: LayerNorm1d, proj: Linear) -> Tensor:
        b, t, f = x.shape
        y = proj(norm(x.reshape((b * t, f))))                        # (B*T, nh*d)
        y = y.reshape((b, t, self.num_head, self.dim_head))
        return y.transpose((1, 2))                                   # (B, nh, T, d)

    def forward(self, q: Tensor, k: Optional[Tensor] = None, v: Optional[Tensor] = None
                ) -> Tensor:
        """q (B, T_q, q_features), k/v (B, T_kv, features) (default q) -> (B, T_q, out)."""
        k = q if k is None else k
        v = q if v is None else v
        if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
            raise ValueError(f"AttentionLayer expects (B, T, features) inputs, got {q.shape}, "
                             f"{k.shape}, {v.shape}")
        b, q_len, _ = q.shape
        ### BEGIN YOUR SOLUTION (hw4.nn.transformer)
        qh = self._heads(q, self.prenorm_q, self.q_projection)
        kh = self._heads(k, self.prenorm_k, self.k_projection)
        vh = self._heads(v, self.prenorm_v, self.v_projection)
        out, probs = self.attn(qh, kh, vh)                           # (B, nh, Tq, d)
        self.probs = probs.detach()  # for inspection; must not keep this step's graph alive
        out = out.transpose((1, 2)).reshape((b * q_len, self.num_head * self.dim_head))
        return self.out_projection(out).reshape((b, q_len, self.out_features))
        ### END YOUR SOLUTION


class TransformerLayer(Module):
    """Pre-norm block: x + attn(x), then x + FFN(LayerNorm(x)) with ReLU and dropout."""

    def __init__(self, q_features: int, num_head: int, dim_head: int, hidden_size: int, *,
                 dropout: float = 0.0, causal: bool = True,
                 device: Optional[BackendDevice] = None, dtype: str = "float32") -> None:
        super().__init__()
        kw = DeviceDtype(device=device, dtype=dtype)
        self.attn = AttentionLayer(q_features, num_head, dim_head, out_features=q_features,
                                   dropout=dropout, causal=causal, **kw)
        self.layernorm1 = LayerNorm1d(q_features, fused=True, **kw)
        self.linear1 = Linear(q_features, hidden_size, **kw)
        self.linear2 = Linear(hidden_size, q_features, **kw)
        self.relu = ReLU()
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, q_features) -> (B, T, q_features)."""
        b, t, f = x.shape
        ### BEGIN YOUR SOLUTION (hw4.nn.transformer)
        x = x + self.dropout(self.attn(x))
        h = self.layernorm1(x.reshape((b * t, f)))
        h = self.dropout(self.relu(self.linear1(h)))
        return x + self.dropout(self.linear2(h)).reshape((b, t, f))
        ### END YOUR SOLUTION


class Transformer(Module):
    """A stack of TransformerLayers with a learned positional embedding.

    Input (T, B, D) (or (B, T, D) with ``batch_first``); returns (output, zeros_like(output))
    so it can replace an RNN/LSTM in a language model.
    """

    def __init__(self, embedding_size: int, hidden_size: int, num_layers: int, *,
                 num_head: int = 8, dim_head: int = 32, dropout: float = 0.0,
                 causal: bool = True, device: Optional[BackendDevice] = None,
                 dtype: str = "float32", batch_first: bool = False,
                 sequence_len: int = 2048) -> None:
        super().__init__()
        self.embedding_size = embedding_size
        self.batch_first = batch_first
        self.sequence_len = sequence_len
        kw = DeviceDtype(device=device, dtype=dtype)
        self.layers = Sequential(*[
            TransformerLayer(embedding_size, num_head, dim_head, hidden_size, dropout=dropout,
                             causal=causal, **kw) for _ in range(num_layers)])
        self.pos_embedding = Embedding(sequence_len, embedding_size, gather=True, **kw)

    @staticmethod
    def positions(t: int, b: int, device: BackendDevice) -> Tensor:
        """The (T, B) int64 constant of positions 0..T-1 down each column (uploaded once per
        shape and device, ``device.constant``)."""
        return Tensor.make_const(device.constant(
            ("positions", t, b), lambda: np.broadcast_to(np.arange(t)[:, None], (t, b)),
            "int64"))

    def forward(self, x: Tensor, h: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """Exercise hw4.nn.transformer (with the layers above): x (B, T, D) (or (T, B, D) when not
        batch_first) plus learned position embeddings of positions 0..T-1 (``self.pos_embedding``
        of ``self.positions(T, B, device)``, a (T, B) int64 tensor, transposed to (B, T, D)),
        then ``self.layers``."""
        if x.ndim != 3 or x.shape[2] != self.embedding_size:
            raise ValueError(f"Transformer expects input with {self.embedding_size} features, "
                             f"got {x.shape}")
        if not self.batch_first:
            x = x.transpose((0, 1))                                  # (B, T, D)
        b, t, _ = x.shape
        if t > self.sequence_len:
            raise ValueError(f"sequence length {t} exceeds sequence_len={self.sequence_len}")
        ### BEGIN YOUR SOLUTION (hw4.nn.transformer)
        pos = self.pos_embedding(self.positions(t, b, x.device))          # (T, B, D)
        x = self.layers(x + pos.transpose((0, 1)))
        ### END YOUR SOLUTION
        if not self.batch_first:
            x = x.transpose((0, 1))
        return x, init.zeros_like(x)

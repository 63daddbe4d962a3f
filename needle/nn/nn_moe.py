"""A mixture-of-experts feed-forward layer with top-k gating and expert capacity.

Shazeer et al., "Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts
Layer", arXiv:1701.06538 (top-k gating); Lepikhin et al., "GShard", arXiv:2006.16668 (top-2,
expert capacity, second choices placed after every first choice); Fedus et al., "Switch
Transformers", arXiv:2101.03961 (top-1, capacity = capacity_factor * tokens * k / experts, and
the load-balancing loss of eq. 4: aux = E * sum_i f_i P_i, where f_i is the fraction of tokens whose
first choice is expert i and P_i the mean router probability of expert i).

A token routed to an expert that is already full is dropped for that expert (it contributes
zero there; the caller's residual connection carries it). ``dropped`` counts them.
"""
import math
from typing import List, NamedTuple, Optional, Tuple

import numpy as np

from .. import backend_ndarray as array_api
from .. import ops
from ..autograd import Tensor
from ..backend_ndarray import BackendDevice
from ..ops.ops_indexing import ScatterAddRows
from .nn_basic import Linear, ReLU
from .nn_module import DeviceDtype, Module

__all__ = ["MoE", "Expert", "Routing", "route"]


class Routing(NamedTuple):
    """Which tokens each expert processes, and what was dropped."""

    tokens: List[np.ndarray]      # per expert: token rows it processes, in arrival order
    choices: List[np.ndarray]     # per expert: which of the token's k choices this is
    dropped: int                  # (token, choice) assignments over capacity
    first_choice_counts: np.ndarray  # (E,) tokens whose first choice is expert e


def route(probs: np.ndarray, top_k: int, capacity: int) -> Routing:
    """Top-k experts per token by probability; fill experts up to ``capacity``, first choices
    of all tokens before any second choice (GShard, arXiv:2006.16668, Algorithm 1)."""
    n, e = probs.shape
    order = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]     # (N, k)
    fill = np.zeros(e, dtype=np.int64)
    tokens: List[List[int]] = [[] for _ in range(e)]
    choices: List[List[int]] = [[] for _ in range(e)]
    dropped = 0
    for j in range(top_k):
        for t in range(n):
            x = order[t, j]
            if fill[x] < capacity:
                fill[x] += 1
                tokens[x].append(t)
                choices[x].append(j)
            else:
                dropped += 1
    return Routing([np.array(t, dtype=np.int64) for t in tokens],
                   [np.array(c, dtype=np.int64) for c in choices], dropped,
                   np.bincount(order[:, 0], minlength=e))


class Expert(Module):
    """One expert: the Transformer's feed-forward block, linear2(relu(linear1(x)))."""

    def __init__(self, d_model: int, d_ff: int, device: Optional[BackendDevice] = None,
                 dtype: str = "float32") -> None:
        super().__init__()
        self.linear1 = Linear(d_model, d_ff, device=device, dtype=dtype)
        self.relu = ReLU()
        self.linear2 = Linear(d_ff, d_model, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.relu(self.linear1(x)))


def rows(x: Tensor, idx: np.ndarray) -> Tensor:
    """x[idx] for a 2-D x (gradient: scatter-add back)."""
    return ops.embedding(x, idx.astype(np.int64))


def scatter_rows(y: Tensor, idx: np.ndarray, n: int) -> Tensor:
    """zeros(n, d) with row i of y added at row idx[i]."""
    nd = array_api.array(idx.astype(np.int64), dtype="int64", device=y.device)
    return ScatterAddRows(nd, n)(y)


class MoE(Module):
    """Top-k routed mixture of ``num_experts`` feed-forward experts (single process)."""

    def __init__(self, d_model: int, d_ff: int, num_experts: int, top_k: int = 1,
                 capacity_factor: float = 1.25, device: Optional[BackendDevice] = None,
                 dtype: str = "float32") -> None:
        super().__init__()
        if top_k not in (1, 2) or top_k > num_experts:
            raise ValueError(f"MoE: top_k must be 1 or 2 and <= num_experts ({num_experts}), "
                             f"got {top_k}")
        if not capacity_factor > 0:  # 0 slots per expert: every token dropped, output all zero
            raise ValueError(f"MoE: capacity_factor must be > 0, got {capacity_factor}")
        self.d_model, self.num_experts = d_model, num_experts
        self.top_k, self.capacity_factor = top_k, capacity_factor
        kw = DeviceDtype(device=device, dtype=dtype)
        self.router = Linear(d_model, num_experts, bias=False, **kw)
        self.experts = [Expert(d_model, d_ff, **kw) for _ in range(num_experts)]
        self.aux_loss: Optional[Tensor] = None
        self.dropped = 0
        self.tokens_per_expert = np.zeros(num_experts, dtype=np.int64)

    def capacity(self, num_tokens: int) -> int:
        """Slots per expert: ceil(capacity_factor * tokens * k / experts)."""
        return int(math.ceil(self.capacity_factor * num_tokens * self.top_k / self.num_experts))

    def gate(self, x: Tensor) -> Tuple[Tensor, Routing]:
        """Router on x (N, d): gate weights (N, k) of the chosen experts, and the routing.

        Also sets ``aux_loss`` (Switch eq. 4), ``dropped`` and ``tokens_per_expert``."""
        n = x.shape[0]
        probs = ops.softmax(self.router(x), axis=-1)                  # (N, E)
        r = route(probs.numpy(), self.top_k, self.capacity(n))
        order = np.argsort(-probs.numpy(), axis=1, kind="stable")[:, :self.top_k]
        onehots = [np.eye(self.num_experts)[order[:, j]] for j in range(self.top_k)]
        picks = [(probs * Tensor(h, device=x.device, dtype=x.dtype, requires_grad=False)
                  ).sum((1,)).reshape((n, 1)) for h in onehots]       # (N, 1) each
        gates = picks[0] if self.top_k == 1 else ops.stack(picks, 1).reshape((n, self.top_k))
        if self.top_k > 1:  # GShard renormalizes the top-2 gates to sum to one
            gates = gates / gates.sum((1,)).reshape((n, 1)).broadcast_to(gates.shape)
        f = r.first_choice_counts / n                                 # (E,) constant
        p_mean = probs.sum((0,)) / n                                  # (E,)
        f_t = Tensor(f, device=x.device, dtype=x.dtype, requires_grad=False)
        self.aux_loss = (f_t * p_mean).sum() * self.num_experts
        self.dropped = r.dropped
        self.tokens_per_expert = np.array([len(t) for t in r.tokens], dtype=np.int64)
        return gates, r

    def forward(self, x: Tensor) -> Tensor:
        """(..., d_model) -> (..., d_model): sum over chosen experts of gate * expert(x)."""
        if x.shape[-1] != self.d_model:
            raise ValueError(f"MoE(d_model={self.d_model}) got input of shape {x.shape}")
        shape = x.shape
        n = int(np.prod(shape[:-1]))
        flat = x.reshape((n, self.d_model))                           # (N, d)
        gates, r = self.gate(flat)
        gate_rows = gates.reshape((n * self.top_k, 1))
        out = None
        for e, expert in enumerate(self.experts):
            tok = r.tokens[e]
            if len(tok) == 0:
                continue                                              # an idle expert
            y = expert(rows(flat, tok))                               # (n_e, d)
            g = rows(gate_rows, tok * self.top_k + r.choices[e])      # (n_e, 1)
            part = scatter_rows(y * g.broadcast_to(y.shape), tok, n)  # (N, d)
            out = part if out is None else out + part
        if out is None:
            out = flat * 0.0
        return out.reshape(shape)

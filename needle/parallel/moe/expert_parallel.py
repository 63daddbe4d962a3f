"""Expert parallelism: the experts of an ``nn.MoE`` sharded across ranks, tokens sent to them.

GShard / Switch: an all-to-all *dispatches* tokens to their experts' ranks, a second *combines*
the results. Counts are all-gathered first, with d_model and E, so a mismatched configuration
fails on every rank. Built with the same seed, it equals the serial ``nn.MoE`` on each rank.
"""
from typing import Any, Optional

import numpy as np

from ... import numbers
from ...autograd import Tensor
from ...nn.nn_moe import MoE, rows, scatter_rows
from ..comm.agree import agree
from ..comm.protocol import Comm
from ..input_agreement import disagreement
from ..inputs import check_device, check_width, on_rank
from .ep_comms import all_to_all

__all__ = ["ExpertParallelMoE"]


class ExpertParallelMoE(MoE):
    """``nn.MoE`` whose experts live on different ranks of ``comm``."""

    def __init__(self, d_model: int, d_ff: int, num_experts: int, comm: Comm, top_k: int = 1,
                 capacity_factor: float = 1.25, device: Optional[Any] = None,
                 dtype: str = "float32") -> None:
        what = f"ExpertParallelMoE{on_rank(comm)}"
        d_model, d_ff, num_experts = (numbers.count_arg(v, f"{what}: {k}", lo=1) for k, v in (
            ("d_model", d_model), ("d_ff", d_ff), ("num_experts", num_experts)))
        if num_experts % comm.size:
            raise ValueError(f"ExpertParallelMoE: {num_experts} experts do not split evenly over "
                             f"{comm.size} ranks")
        agree(comm, "ExpertParallelMoE", {"d_model": d_model, "d_ff": d_ff,
                                          "num_experts": num_experts, "top_k": top_k,
                                          "capacity_factor": capacity_factor, "dtype": dtype})
        super().__init__(d_model, d_ff, num_experts, top_k, capacity_factor, device, dtype)
        self.comm = comm
        per = num_experts // comm.size
        self.first_expert = comm.rank * per
        self.experts = self.experts[self.first_expert:self.first_expert + per]  # keep mine

    def _exchange_counts(self, counts: np.ndarray) -> np.ndarray:
        """(p, E) tokens each rank sends to each expert, after checking every rank agrees."""
        mine = np.concatenate([[self.d_model, self.num_experts], counts]).reshape(1, -1)
        try:
            table = self.comm.allgather(mine.astype(np.int64), label="moe.counts")
        except ValueError as err:  # a different E gives a different shape: the comm says so
            # (only that: a timeout or deadlock, a rank that left, is no disagreement)
            raise ValueError(f"ExpertParallelMoE: ranks disagree on the configuration "
                             f"(this rank: d_model={self.d_model}, "
                             f"num_experts={self.num_experts}): {err}") from err
        if not (table[:, 0] == self.d_model).all() or not (table[:, 1] == self.num_experts).all():
            raise ValueError(f"ExpertParallelMoE: ranks disagree on (d_model, num_experts): "
                             f"{[tuple(r) for r in table[:, :2]]}")
        return table[:, 2:]

    def forward(self, x: Tensor) -> Tensor:
        """(..., d_model) -> (..., d_model): this rank's tokens through experts anywhere."""
        # before the count exchange: a width only this rank got would stall the others
        what = f"ExpertParallelMoE(d_model={self.d_model})"
        check_width(x.shape, self.d_model, self.comm, what)
        check_device(x, self.router.weight, self.comm, what)
        shape, p, e_all = x.shape, self.comm.size, self.num_experts
        per = e_all // p
        n = int(np.prod(shape[:-1]))
        flat = x.reshape((n, self.d_model))                          # (N, d)
        gates, r = self.gate(flat)
        counts = np.array([len(t) for t in r.tokens], dtype=np.int64)  # (E,)
        table = self._exchange_counts(counts)                        # (p, E)
        per_pair = table.reshape(p, p, per).sum(axis=2)              # [src, dst] rows
        max_rows = int(per_pair.max())
        send_idx = np.concatenate(r.tokens)                          # grouped by expert
        send_choice = np.concatenate(r.choices)
        with disagreement(self.comm, what):  # e.g. tokens of another dtype
            dispatched = all_to_all(rows(flat, send_idx), self.comm, per_pair[self.comm.rank],
                                    per_pair[:, self.comm.rank], max_rows,
                                    "moe.dispatch")                  # (R, d)
        # received: for each source rank, its rows for my experts, expert by expert
        mine = table[:, self.first_expert:self.first_expert + per]   # (p, E/p)
        offsets = np.concatenate([[0], np.cumsum(mine.reshape(-1))]).reshape(-1)
        total = int(offsets[-1])
        result = dispatched * 0.0
        for el, expert in enumerate(self.experts):
            idx = np.concatenate([np.arange(offsets[j * per + el], offsets[j * per + el + 1])
                                  for j in range(p)]).astype(np.int64)
            if len(idx) == 0:
                continue                                             # an idle expert
            y = expert(rows(dispatched, idx))                        # (n_e, d)
            result = result + scatter_rows(y, idx, total)
        back = all_to_all(result, self.comm, per_pair[:, self.comm.rank],
                          per_pair[self.comm.rank], max_rows, "moe.combine")  # (S, d)
        g = rows(gates.reshape((n * self.top_k, 1)), send_idx * self.top_k + send_choice)
        out = scatter_rows(back * g.broadcast_to(back.shape), send_idx, n)  # (N, d)
        return out.reshape(shape)

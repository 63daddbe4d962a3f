"""Cross-entropy over vocabulary-parallel logits, without ever gathering the full vocabulary.

Megatron-LM (Shoeybi et al., arXiv:1909.08053, sec. 3, "we fuse the output embedding GEMM with
the cross entropy loss"): rank r holds logits z[:, V_r] for its slice V_r of the vocabulary.
    loss_i = log sum_v exp(z_iv - m_i) + m_i - z_{i, y_i}
needs only three reductions of B numbers each, never the (B, V) logits:
    1. m_i = max over ranks of max_{v in V_r} z_iv               (allreduce, op="max")
    2. z_{i, y_i}: the rank owning y_i contributes it, others 0    (allreduce, sum)
    3. sum over ranks of sum_{v in V_r} exp(z_iv - m_i)            (allreduce, sum)
The gradient on rank r is (softmax(z)[:, V_r] - onehot(y)[:, V_r]) / B: local, no communication.

Every rank must hold the same targets and a shard of the same width (rank r's offset is r V/p):
otherwise each rank's sums mix different losses into one wrong answer. A CRC-32 of the targets
and the width ride in the first allreduce's ``context`` (no extra message); the naive gathered
loss has no such call and pays one allgather of two int64 per rank.
"""
from typing import Any, cast

import numpy as np

from ...autograd import NDArray, Tensor, TensorOp
from ...nn.nn_basic import SoftmaxLoss
from ..comm.protocol import Comm
from ..input_agreement import agree_inputs, checksum, disagreement, pack
from ..inputs import check_indices, on_rank
from .tp_comms import gather_from_region

__all__ = ["vocab_parallel_cross_entropy", "VocabParallelCrossEntropy",
           "gathered_cross_entropy"]


def gathered_cross_entropy(logits_shard: Tensor, targets: Any, comm: Comm) -> Tensor:
    """The naive version: all-gather the full (B, V) logits on every rank, then the serial
    loss. Correct, but every rank receives B * V numbers (and keeps them for backward)."""
    what = "gathered_cross_entropy"
    t = _checked_targets(logits_shard, targets, comm, what)
    agree_inputs(comm, what, {"targets (CRC-32)": checksum(t),
                              "shard width": logits_shard.shape[1]}, "ce.agree")
    with disagreement(comm, what):
        full = gather_from_region(logits_shard, comm)               # (B, V)
    return SoftmaxLoss()(full, Tensor(t, device=full.device, dtype="int64",
                                      requires_grad=False))


class VocabParallelCrossEntropy(TensorOp):
    """Mean cross-entropy of (B, V/p) logit shards against targets (B,) in [0, V)."""

    def __init__(self, targets: np.ndarray, comm: Comm) -> None:
        self.targets, self.comm = targets, comm
        self.probs: Any = None  # (B, V/p) softmax, kept for the gradient
        self.onehot: Any = None

    def compute(self, logits: NDArray) -> NDArray:
        z = logits.numpy()                                           # (B, V/p)
        n, vp = z.shape
        start = self.comm.rank * vp
        m = self._max(z)                                             # 1. (B,)
        local = self.targets - start
        mine = (local >= 0) & (local < vp)
        rows = np.arange(n)
        z_y = np.where(mine, z[rows, np.clip(local, 0, vp - 1)], 0.0).astype(z.dtype)
        z_y = self.comm.allreduce(z_y, label="ce.target_logit")     # 2. (B,)
        e = np.exp(z - m[:, None])                                   # (B, V/p)
        s = self.comm.allreduce(e.sum(axis=1), label="ce.sum_exp")  # 3. (B,)
        self.probs = e / s[:, None]
        self.onehot = np.zeros_like(z)
        self.onehot[rows[mine], local[mine]] = 1.0
        loss = np.mean(np.log(s) + m - z_y)
        return NDArray(np.asarray(loss, dtype=z.dtype), device=logits.device, dtype=logits.dtype)

    def _max(self, z: np.ndarray) -> np.ndarray:
        """Step 1's allreduce, its context checking that the ranks' targets and widths agree."""
        bits = (32, 30)
        context = pack((checksum(np.asarray(self.targets, dtype=np.int64)), z.shape[1]), bits)
        with disagreement(self.comm, "VocabParallelCrossEntropy",
                          ("targets (CRC-32)", "shard width"), bits):
            return self.comm.allreduce(z.max(axis=1), op="max", label="ce.max",
                                       context=context)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        logits = cast(Tensor, node.inputs[0])
        g = (self.probs - self.onehot) / self.probs.shape[0]
        g = Tensor(g, device=logits.device, dtype=logits.dtype, requires_grad=False)
        return g * out_grad.reshape((1, 1)).broadcast_to(g.shape)


def _checked_targets(logits_shard: Tensor, targets: Any, comm: Comm, what: str) -> np.ndarray:
    """``nn.SoftmaxLoss``'s checks, on this rank's shard: logits (B, V/p), targets (B,) of
    whole numbers in [0, V) with V = p * V/p; int64 targets."""
    shape = tuple(logits_shard.shape)
    tshape = tuple(getattr(targets, "shape", np.shape(targets)))
    if len(shape) != 2 or tshape != shape[:1]:
        raise ValueError(f"{what}{on_rank(comm)} expects logits (B, V/p) and targets (B,), "
                         f"got {shape} and {tshape}")
    return check_indices(targets, shape[1] * comm.size, comm, what + " targets")


def vocab_parallel_cross_entropy(logits_shard: Tensor, targets: Any, comm: Comm) -> Tensor:
    """Mean cross-entropy (a scalar on every rank) of vocab-sharded logits (B, V/p)."""
    t = _checked_targets(logits_shard, targets, comm, "vocab_parallel_cross_entropy")
    return VocabParallelCrossEntropy(t.reshape(-1), comm)(logits_shard)

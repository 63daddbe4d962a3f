"""The alpha-beta (Hockney) cost model: a message of n bytes costs ``alpha + n * beta`` seconds.

The textbook analysis of collectives (Thakur, Rabenseifner and Gropp, IJHPCA 2005; Chan et al.,
"Collective communication: theory, practice, and experience", 2007) charges every message a
latency ``alpha`` and every byte a transfer time ``beta``.  A rank's sends happen one after the
other, so a collective takes about ``max over ranks of (messages sent * alpha + bytes sent *
beta)``; for the ring allreduce on p ranks and N bytes that is the classic
``2 (p - 1) alpha + 2 (p - 1) / p * N beta``.  ``seconds`` applies it to what an algorithm
declares it sends (``select.steps``, checked against the ledger), the planner's per-call time.

``predict`` prices a message trace of the virtual cluster (``virtual.Cluster(p, trace=True)``):
every message of the real schedule, pieces and argument checks included.  ``fit`` measures
alpha and beta from timed point-to-point exchanges, as ``benchmarks/bench_collectives.py`` does
for the defaults below (this project's 2-core machine, ``mpiexec -n 2``, shared memory).
"""
from typing import Dict, Iterable, NamedTuple, Sequence

import numpy as np

from .steps import Steps

ALPHA = 3.6e-6  # seconds per message (2 ranks, fitted by the benchmark: benchmarks/README.md,
BETA = 7.0e-11  # seconds per byte (14.3 GB/s)           "Collectives")


class CostModel(NamedTuple):
    """``alpha`` seconds per message, ``beta`` seconds per byte."""

    alpha: float = ALPHA
    beta: float = BETA

    def message(self, nbytes: int) -> float:
        """Seconds to send one message of ``nbytes``."""
        return self.alpha + nbytes * self.beta

    def predict(self, trace: Iterable) -> float:
        """Predicted seconds of a traced run (items with ``.src`` and ``.nbytes``, e.g.
        ``transport/inprocess.py``'s ``Message``): the busiest sender's total."""
        busy: Dict[int, float] = {}
        for m in trace:
            busy[m.src] = busy.get(m.src, 0.0) + self.message(m.nbytes)
        return max(busy.values(), default=0.0)

    @classmethod
    def fit(cls, sizes: Sequence[int], seconds: Sequence[float]) -> "CostModel":
        """Least-squares ``alpha`` and ``beta`` from one-message times at several sizes, with
        relative errors (so the small sizes, which decide alpha, weigh as much as the large)."""
        n = np.asarray(sizes, dtype=np.float64)
        t = np.asarray(seconds, dtype=np.float64)
        a = np.stack([1.0 / t, n / t], axis=1)  # (alpha + n beta) / t ~ 1
        (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        return cls(float(max(alpha, 0.0)), float(max(beta, 0.0)))

    def seconds(self, steps: Steps) -> float:
        """Predicted seconds of a call that sends ``steps`` (``select.steps``): the busiest's."""
        msgs, nbytes = steps.per_rank()
        return float(np.max(msgs * self.alpha + nbytes * self.beta, initial=0.0))


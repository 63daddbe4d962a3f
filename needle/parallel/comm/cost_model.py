"""The alpha-beta (Hockney) cost model: a message of n bytes costs ``alpha + n * beta`` seconds.

The textbook analysis of collectives (Thakur, Rabenseifner and Gropp, IJHPCA 2005; Chan et al.,
"Collective communication: theory, practice, and experience", 2007) charges every message a
latency ``alpha`` and every byte a transfer time ``beta``.  A rank's sends happen one after the
other, so a collective takes about ``max over ranks of (messages sent * alpha + bytes sent *
beta)``; for the ring allreduce on p ranks and N bytes that is the classic
``2 (p - 1) alpha + 2 (p - 1) / p * N beta``.

``predict`` applies the model to a message trace: the list of messages a run actually sent,
recorded by the virtual cluster (``virtual.Cluster(p, trace=True)``), so the prediction counts
every message of the real schedule, pieces and argument checks included.  ``fit`` measures alpha
and beta from timed point-to-point exchanges (``benchmarks/bench_collectives.py`` does this and
prints predicted against measured times).  The defaults below were measured by that benchmark on
this project's 2-core machine (``mpiexec -n 2``, shared memory).

``TwoLevelModel`` extends the model to ranks on several hosts: one (alpha, beta) between ranks
of a host and one across hosts, with the ranks of a host sharing its link; it prices the
textbook schedules of ``allreduce_steps`` (``benchmarks/bench_multihost.py`` compares them with
measured times on the namespace test cluster, ``tools/testcluster``).
"""
from typing import Any, Dict, Iterable, List, NamedTuple, Sequence, Tuple

import numpy as np

ALPHA = 3.6e-6  # seconds per message (2 ranks, fitted by the benchmark: benchmarks/README.md,
BETA = 7.0e-11  # seconds per byte (14.3 GB/s)           "Collectives")


class CostModel(NamedTuple):
    """``alpha`` seconds per message, ``beta`` seconds per byte."""

    alpha: float = ALPHA
    beta: float = BETA

    def message(self, nbytes: int) -> float:
        """Seconds to send one message of ``nbytes``."""
        return self.alpha + nbytes * self.beta

    def per_rank(self, trace: Iterable) -> Dict[int, float]:
        """Seconds each sender spends sending its messages (``trace``: items with ``.src`` and
        ``.nbytes``, e.g. ``transport_inprocess.Message``)."""
        busy: Dict[int, float] = {}
        for m in trace:
            busy[m.src] = busy.get(m.src, 0.0) + self.alpha + m.nbytes * self.beta
        return busy

    def predict(self, trace: Iterable) -> float:
        """Predicted seconds of the traced run: the busiest sender's total."""
        busy = self.per_rank(trace)
        return max(busy.values()) if busy else 0.0

    @classmethod
    def fit(cls, sizes: Sequence[int], seconds: Sequence[float]) -> "CostModel":
        """Least-squares ``alpha`` and ``beta`` from one-message times at several sizes, with
        relative errors (so the small sizes, which decide alpha, weigh as much as the large)."""
        n = np.asarray(sizes, dtype=np.float64)
        t = np.asarray(seconds, dtype=np.float64)
        a = np.stack([1.0 / t, n / t], axis=1)  # (alpha + n beta) / t ~ 1
        (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        return cls(float(max(alpha, 0.0)), float(max(beta, 0.0)))

    def ring_allreduce(self, nbytes: int, p: int) -> float:
        """The textbook ring allreduce time ``2 (p - 1) (alpha + N / p * beta)``."""
        return 2 * (p - 1) * (self.alpha + nbytes / p * self.beta) if p > 1 else 0.0


# -- two link classes: ranks on one host, ranks on different hosts -----------------------------
# A schedule is a list of steps; a step is the messages (src, dst, nbytes) sent at once.
Step = List[Tuple[int, int, int]]


class TwoLevelModel(NamedTuple):
    """Alpha-beta with two link classes: ``intra`` between ranks of one host, ``inter`` across
    hosts, where every rank of a host shares the host's one link (``nodes[r]``: r's host).

    A step costs its slowest message, or the busiest host link (the bytes all its ranks push
    through it one way, at ``inter.beta``), whichever is longer; a schedule, the sum of its
    steps.  Steps are taken as synchronous: pipelining across steps is not modelled."""

    intra: CostModel
    inter: CostModel

    def step(self, msgs: Step, nodes: Sequence[Any]) -> float:
        """Seconds of one step of messages sent at once."""
        worst, out, into = 0.0, {}, {}  # type: float, Dict[Any, int], Dict[Any, int]
        for src, dst, n in msgs:
            cross = nodes[src] != nodes[dst]
            worst = max(worst, (self.inter if cross else self.intra).message(n))
            if cross:
                out[nodes[src]] = out.get(nodes[src], 0) + n
                into[nodes[dst]] = into.get(nodes[dst], 0) + n
        link = max(list(out.values()) + list(into.values()) + [0])
        return max(worst, self.inter.alpha + link * self.inter.beta if link else 0.0)

    def schedule(self, steps: List[Step], nodes: Sequence[Any]) -> float:
        """Seconds of a whole schedule (e.g. ``allreduce_steps``)."""
        return sum(self.step(s, nodes) for s in steps)


def allreduce_steps(algorithm: str, nbytes: int, nodes: Sequence[Any]) -> List[Step]:
    """The textbook schedule of an allreduce of ``nbytes`` on ``len(nodes)`` ranks: ``ring``,
    ``recursive_doubling`` (p a power of two), ``tree`` (binomial reduce to rank 0, then
    binomial broadcast) or ``hierarchical`` (``hierarchical.py``; ranks placed host by host)."""
    p = len(nodes)
    if algorithm == "ring":
        return [[(r, (r + 1) % p, nbytes // p) for r in range(p)]] * (2 * (p - 1))
    if algorithm == "recursive_doubling":
        if p & (p - 1):
            raise ValueError(f"recursive_doubling_steps: p = {p} is not a power of two")
        return [[(r, r ^ m, nbytes) for r in range(p)] for m in _powers(p)]
    if algorithm == "tree":
        reduce = [[(v + m, v, nbytes) for v in range(0, p, 2 * m) if v + m < p]
                  for m in _powers(p)]
        return reduce + [[(d, s, n) for s, d, n in step] for step in reversed(reduce)]
    if algorithm == "hierarchical":
        from .hierarchical import host_groups
        groups = host_groups(nodes)
        h, loc = len(groups), len(groups[0])
        near = [[(g[i], g[(i + 1) % loc], nbytes // loc) for g in groups for i in range(loc)]]
        far = [[(groups[k][i], groups[(k + 1) % h][i], nbytes // (loc * h))
                for k in range(h) for i in range(loc)]]
        near = near * (loc - 1) if loc > 1 else []
        return near + far * (2 * (h - 1)) + near
    raise ValueError(f"unknown allreduce algorithm {algorithm!r}")


def _powers(p: int) -> List[int]:
    """1, 2, 4, ... below p."""
    out, m = [], 1
    while m < p:
        out.append(m)
        m <<= 1
    return out

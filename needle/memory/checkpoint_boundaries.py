"""Choosing checkpoint boundaries for a memory budget: an exact dynamic program over a chain.

Cost model (needle's backward keeps every forward node alive until it returns). Layer i keeps
``act[i]`` bytes when run plainly (its saved tensors and output), outputs ``out[i]`` bytes and
costs ``cost[i]`` to run forward. Checkpointed consecutive segments cover the prefix [0, t)
and the tail [t, n) runs plainly (what ``checkpoint_sequential`` executes). Then

    stored    = sum_{segments [s, e)} out[e-1]  +  sum_{i >= t} act[i]
    peak      = stored + max_{segments} sum_{i in [s, e)} act[i]      (one segment recomputed)
    recompute = sum_{i < t} cost[i]                                   (one extra forward of it)

Chen et al. 2016 (arXiv:1604.06174, sec. 4.3) search greedily over a per-segment budget; here
the search is exact: for every cap K on a segment's inside (the distinct segment sums), the
least ``stored`` of each prefix is a one-objective DP ``f_K(t) = min_j f_K(j) + out[t-1]`` over
segments [j, t) whose sum is <= K, vectorised over K. The segments with the least recompute
whose peak fits the budget are returned (ties: the smaller peak).
"""
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from .tracker import MemoryTracker

__all__ = ["CheckpointSegments", "choose_checkpoints", "evaluate_segments", "profile_chain"]


@dataclass
class CheckpointSegments:
    """Checkpointed segments [(start, end)], the plain tail start, predicted peak and cost."""

    segments: List[Tuple[int, int]]
    plain_from: int
    peak: float
    recompute: float
    n: int = 0
    stored: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def boundaries(self) -> List[int]:
        """Segment start indices for ``checkpoint_sequential(..., boundaries=...)``."""
        starts = [s for s, _ in self.segments]
        if self.plain_from < self.n:
            starts.append(self.plain_from)
        return starts or [0]

    @property
    def checkpoint_last(self) -> bool:
        """True when the chain ends in a checkpointed segment (no plain tail)."""
        return bool(self.segments) and self.plain_from >= self.n


def _check(act: Sequence[float], out: Sequence[float], cost: Sequence[float]) -> None:
    if not (len(act) == len(out) == len(cost)) or not act:
        raise ValueError(f"act, out and cost must be non-empty and of one length, got "
                         f"{len(act)}, {len(out)}, {len(cost)}")
    if min(act) < 0 or min(out) < 0 or min(cost) < 0:
        raise ValueError("act, out and cost must be non-negative")


def evaluate_segments(segments: Sequence[Tuple[int, int]], plain_from: int, act: Sequence[float],
                  out: Sequence[float], cost: Sequence[float]) -> Tuple[float, float, float]:
    """(peak, recompute, stored) of these segments under the cost model above."""
    stored = sum(out[e - 1] for _, e in segments) + sum(act[plain_from:])
    inside = max((sum(act[s:e]) for s, e in segments), default=0.0)
    return stored + inside, float(sum(cost[:plain_from])), stored


def choose_checkpoints(act: Sequence[float], budget: float,
                       out: Optional[Sequence[float]] = None,
                       cost: Optional[Sequence[float]] = None) -> CheckpointSegments:
    """The least-recompute segments whose predicted peak is <= ``budget`` (exact over the model)."""
    act = [float(v) for v in act]
    n = len(act)
    out = list(act) if out is None else [float(v) for v in out]
    cost = [1.0] * n if cost is None else [float(v) for v in cost]
    _check(act, out, cost)
    a = np.asarray(act, dtype=np.float64)
    o = np.asarray(out, dtype=np.float64)
    c = np.asarray(cost, dtype=np.float64)
    prefix = np.concatenate([[0.0], np.cumsum(a)])
    tail = prefix[-1] - prefix                          # tail[t] = sum act[t:]
    seg = prefix[None, :] - prefix[:, None]             # seg[j, t] = sum act[j:t]
    all_caps = np.unique(seg[np.triu_indices(n + 1, 1)])
    caps = all_caps[all_caps <= budget]
    if not caps.size:  # nothing fits (tail[0] is a cap): the DP finds the least peak to report
        caps = all_caps
    best: Optional[Tuple[float, float, int, int]] = None  # (recompute, peak, t, K's index)
    if tail[0] <= budget:
        best = (0.0, float(tail[0]), 0, 0)
    lowest = float(tail[0])
    inf = np.inf
    f = np.full((caps.size, n + 1), inf)
    f[:, 0] = 0.0
    for t in range(1, n + 1):
        for j in range(t):
            ok = seg[j, t] <= caps
            cand = np.where(ok, f[:, j] + o[t - 1], inf)
            np.minimum(f[:, t], cand, out=f[:, t])
        peaks = f[:, t] + tail[t] + caps
        k = int(np.argmin(peaks))
        lowest = min(lowest, float(peaks[k]))
        if peaks[k] <= budget:
            rec = float(c[:t].sum())
            key = (rec, float(peaks[k]))
            if best is None or key < best[:2]:
                best = (rec, float(peaks[k]), t, k)
    if best is None:
        raise ValueError(f"no choice of checkpoints fits a budget of {budget:g} bytes; the least "
                         f"predicted peak for this chain is {lowest:g}")
    _, _, t, k = best
    segments = _reconstruct(seg, o, f[k], t, caps[k])
    peak, rec, stored = evaluate_segments(segments, t, act, out, cost)
    return CheckpointSegments(segments, t, peak, rec, n=n, stored=stored)


def _reconstruct(seg: np.ndarray, o: np.ndarray, f: np.ndarray, t: int, cap: float
                 ) -> List[Tuple[int, int]]:
    """Segments of [0, t) with insides <= cap and the least sum of segment outputs, read back
    from the DP's row ``f`` for this cap (at each end, the first start that attains it)."""
    segments, e = [], t
    while e > 0:
        j = next(j for j in range(e) if seg[j, e] <= cap and f[j] + o[e - 1] == f[e])
        segments.append((j, e))
        e = j
    return segments[::-1]


def profile_chain(modules: Sequence[Callable[[Any], Any]], x: Any
                  ) -> Tuple[List[int], List[int], List[float]]:
    """Measure (act, out, cost) per module with MemoryTracker on one forward pass."""
    trackers, outs, costs = [], [], []
    for m in modules:
        with MemoryTracker() as tr:
            t0 = time.perf_counter()
            x = m(x)
            costs.append(time.perf_counter() - t0)
        trackers.append(tr)
        outs.append(int(x.realize_cached_data().nbytes))
    acts = [tr.current_bytes for tr in trackers]  # what each layer still holds after forward
    del x
    return acts, outs, costs

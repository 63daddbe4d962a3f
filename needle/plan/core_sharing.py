"""How ranks that synchronise share the cores: the slowdown of a compute chunk of ``w``
seconds followed by a wait for every other rank, at p ranks against one rank.

The seconds come from ``measure/core_sharing.py``; the factor is
(T_p(n) - T_p(0)) / (T_1(n) - T_1(0)). Measured, not cores / p: beyond the cores, a rank whose
message has come runs again only when its core-mate's time slice ends, once per message round,
so the factor grows with the rounds (4 ranks on 2 cores: 2.0-4.1x, not 2x).
"""
from typing import List, Sequence, Tuple

import numpy as np


def slowdown_curve(one: Sequence[float], many: Sequence[float]) -> List[Tuple[float, float]]:
    """(w, factor) per chunk size: w the one-rank chunk (the allreduce's own time taken
    out), factor how much longer the same chunk takes at p ranks."""
    return [(o - one[0], (m - many[0]) / (o - one[0])) for o, m in zip(one[1:], many[1:])]


def sharing_factor(curve: Sequence[Tuple[float, float]]) -> float:
    """One factor for the machine at p ranks: the median over the chunk sizes."""
    return float(np.median([f for _, f in curve]))

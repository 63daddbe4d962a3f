"""How ranks that synchronise share the cores: the slowdown of a compute chunk of ``w``
seconds followed by a wait for every other rank, at p ranks against one rank.

The seconds come from ``tools/measure/core_sharing.py`` (run under mpiexec by
``cluster.measure_core_sharing``: small needle MLP steps then a 64 KiB allreduce, for several
chunk sizes, n = 0 first), at p ranks and at one: the factor is
(T_p(n) - T_p(0)) / (T_1(n) - T_1(0)).

Why measured and not cores / p: beyond the cores, a rank that waits gives its core to its
core-mate, and once its message has come it runs again only when the core-mate's time slice
ends (the scheduler does not preempt a running task for one that yielded); a collective of
several rounds can be caught like that more than once. Measured on the 2-core VM, 4 ranks:
each rank's CPU time per step grew (3.5 ms of needle MLP steps per wait took 4.2-6.0 ms of
CPU per rank) and the wall time was the ranks' CPU time / cores, 2.2-3.4x, not 2x; the
factor grows with the wait's message rounds (NumPy chunks: 8-byte and 64 KiB allreduces, 2
rounds of recursive doubling, 2.0-2.6x; MLP steps: 64 KiB 2.2-2.4x, 128 KiB, a 6-round ring,
2.6-4.1x). The loop is synthetic, never the strategy predicted.
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

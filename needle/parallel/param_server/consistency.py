"""Consistency models of a parameter server as one rule on worker clocks.

Ho et al., "Stale Synchronous Parallel Parameter Server" (NeurIPS 2013), sec. 2: a worker at
clock c (iterations finished) may read once the slowest worker's clock is >= c - s. BSP: s = 0,
and the server sums each iteration's gradients into one step (synchronous SGD); SSP(s): bounded
staleness; ASP: s = inf. A worker presumed dead leaves the table under SSP/ASP and is an error
naming it under BSP.
"""
import math
from typing import Dict, Iterable, List, Optional

__all__ = ["CONSISTENCY", "ClockTable", "staleness_of"]

CONSISTENCY = ("bsp", "ssp", "asp")


def staleness_of(consistency: str, staleness: Optional[int] = None) -> float:
    """The staleness bound s of a consistency model (SSP needs ``staleness``)."""
    if consistency not in CONSISTENCY:
        raise ValueError(f"consistency must be one of {CONSISTENCY}, got {consistency!r}")
    if consistency == "bsp":
        return 0
    if consistency == "asp":
        return math.inf
    if not isinstance(staleness, int) or staleness < 0:
        raise ValueError(f"SSP needs a staleness bound s >= 0 (an int), got {staleness!r}")
    return staleness


class ClockTable:
    """Every live worker's clock; who may read at which clock."""

    def __init__(self, workers: Iterable[int], staleness: float) -> None:
        self.clock: Dict[int, int] = {w: 0 for w in workers}
        self.staleness = staleness
        self.dead: List[int] = []

    def min_clock(self) -> int:
        """The slowest live worker's clock (0 when none are left)."""
        return min(self.clock.values(), default=0)

    def can_read(self, clock: int) -> bool:
        """May a worker at ``clock`` read? (slowest >= clock - s)"""
        return self.min_clock() >= clock - self.staleness

    def tick(self, worker: int, clock: int) -> None:
        """``worker`` finished iteration ``clock - 1``."""
        if worker in self.clock:
            self.clock[worker] = max(self.clock[worker], clock)

    def remove(self, worker: int, dead: bool = False) -> None:
        """``worker`` is done (or presumed dead): nobody waits for it any more."""
        if self.clock.pop(worker, None) is not None and dead:
            self.dead.append(worker)

    def laggards(self, clock: int) -> List[int]:
        """The workers a reader at ``clock`` is waiting for."""
        return sorted(w for w, c in self.clock.items() if c < clock - self.staleness)

"""The pipeline's step time from the schedule simulator: makespans are linear in m past the
warm-up, so long runs are simulated at two sizes and extended (exact for GPipe and 1F1B)."""
from functools import lru_cache

from ..parallel.pipeline.schedules import SCHEDULES
from ..parallel.pipeline.simulator import simulate

__all__ = ["pipeline_seconds", "makespan", "SIM_LIMIT"]

SIM_LIMIT = 64


@lru_cache(maxsize=4096)
def makespan(schedule: str, p: int, m: int, v: int, f: float, b: float, comm: float) -> float:
    """The simulator's makespan of one step (per-chunk costs f / v, b / v)."""
    sched = SCHEDULES[schedule](p, m, v) if schedule == "interleaved" else \
        SCHEDULES[schedule](p, m)
    cost = {"F": f / v, "B": b / v}
    return simulate(sched, lambda s, a: cost[a[0]], comm_cost=comm).makespan


def _sig(x: float) -> float:
    """3 significant digits: costs normalised to F = 1 so layouts of one shape share runs."""
    return float(f"{x:.3g}")


def pipeline_seconds(schedule: str, p: int, m: int, f: float, b: float, comm: float = 0.0,
                     chunks: int = 1, limit: int = SIM_LIMIT) -> float:
    """Seconds of one step's forward and backward passes through the pipeline."""
    v = chunks if schedule == "interleaved" else 1
    if p == 1:
        return m * (f + b)
    r, c = _sig(b / f), _sig(comm / f)
    m1 = p * (2 if v > 1 else 1)
    if m <= max(limit, 2 * m1):
        return makespan(schedule, p, m, v, 1.0, r, c) * f
    s1 = makespan(schedule, p, m1, v, 1.0, r, c)
    s2 = makespan(schedule, p, 2 * m1, v, 1.0, r, c)
    return (s1 + (m - m1) * (s2 - s1) / m1) * f

"""Predict a schedule's timeline by list scheduling over ``schedules.py``'s dependencies; a
schedule that can never finish raises ``ScheduleDeadlockError`` instead of hanging."""
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from .schedules import Action

__all__ = ["simulate", "Timeline", "ScheduleDeadlockError", "virtual_stage", "unit_cost"]


class ScheduleDeadlockError(RuntimeError):
    """No stage can run its next action: the schedule waits on itself."""


class Timeline(NamedTuple):
    """Per stage, the (action, start, end) it ran; and the summary figures."""

    events: List[List[Tuple[Action, float, float]]]
    makespan: float
    busy: List[float]

    @property
    def bubble_fraction(self) -> float:
        """Idle time over total stage time, averaged over stages."""
        return sum(self.makespan - b for b in self.busy) / (self.makespan * len(self.busy))


def virtual_stage(stage: int, action: Action, num_stages: int) -> int:
    """Index of the model piece an action runs: chunk c of stage s is piece c*p + s."""
    chunk = action[2] if len(action) > 2 else 0
    return chunk * num_stages + stage


def unit_cost(stage: int, action: Action) -> float:
    """F = 1, B = 2 (a backward is about two forwards)."""
    return 1.0 if action[0] == "F" else 2.0


def simulate(schedule: List[List[Action]], cost: Callable[[int, Action], float] = unit_cost,
             comm_cost: float = 0.0, num_virtual: Optional[int] = None) -> Timeline:
    """The timeline ``schedule`` would produce with ``cost(stage, action)`` seconds per action."""
    p = len(schedule)
    nv = num_virtual or p * max((a[2] + 1 if len(a) > 2 else 1) for s in schedule for a in s)
    done: Dict[Tuple[str, int, int], float] = {}       # (kind, microbatch, virtual stage) -> end
    events: List[List[Tuple[Action, float, float]]] = [[] for _ in range(p)]
    free = [0.0] * p
    pos = [0] * p
    remaining = sum(len(s) for s in schedule)
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(schedule[s]):
                act = schedule[s][pos[s]]
                kind, mb, k = act[0], act[1], virtual_stage(s, act, p)
                if kind == "F":
                    deps = [("F", mb, k - 1, comm_cost)] if k > 0 else []
                else:
                    deps = [("F", mb, k, 0.0)]
                    if k < nv - 1:
                        deps.append(("B", mb, k + 1, comm_cost))
                if any((d[0], d[1], d[2]) not in done for d in deps):
                    break
                start = max([free[s]] + [done[(d[0], d[1], d[2])] + d[3] for d in deps])
                end = start + cost(s, act)
                done[(kind, mb, k)] = end
                events[s].append((act, start, end))
                free[s], pos[s] = end, pos[s] + 1
                remaining -= 1
                progressed = True
        if not progressed:
            heads = {s: schedule[s][pos[s]] for s in range(p) if pos[s] < len(schedule[s])}
            raise ScheduleDeadlockError(f"pipeline schedule cannot proceed; stages wait at {heads}")
    makespan = max(free)
    busy = [sum(e - b for _, b, e in ev) for ev in events]
    return Timeline(events, makespan, busy)

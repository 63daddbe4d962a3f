"""Which steps to record: ``schedule(wait=, warmup=, active=, repeat=)``, torch.profiler's.

    with profile(schedule=schedule(wait=1, warmup=1, active=2), on_trace_ready=save) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

Steps cycle through ``wait`` steps not recorded, ``warmup`` steps recorded and thrown away (the
first steps are slow: caches fill, buffers are allocated), then ``active`` steps recorded; at
the end of each cycle ``on_trace_ready(prof)`` is called. ``repeat=0`` cycles until the end.
"""
import enum
from typing import Callable


class ProfilerAction(enum.Enum):
    """What the profiler does during one step."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def schedule(*, wait: int, warmup: int, active: int, repeat: int = 0,
             skip_first: int = 0) -> Callable[[int], ProfilerAction]:
    """step number -> ``ProfilerAction``, cycling wait, warmup, active ``repeat`` times."""
    for name, value, least in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1),
                               ("repeat", repeat, 0), ("skip_first", skip_first, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"schedule: {name} must be an int >= {least}, got {value!r}")
    cycle = wait + warmup + active

    def action(step: int) -> ProfilerAction:
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if repeat and step >= cycle * repeat:
            return ProfilerAction.NONE
        pos = step % cycle
        if pos < wait:
            return ProfilerAction.NONE
        if pos < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD_AND_SAVE if pos == cycle - 1 else ProfilerAction.RECORD
    return action

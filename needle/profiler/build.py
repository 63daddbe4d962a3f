"""From a recorder's raw logs to one rank's ``RankRecord``: events, memory samples and peaks.

Everything the hot path leaves out is worked out here, once, when the recording is asked for:

- names: an op's class name ("MatMul"), a gradient's with "Backward" appended;
- args: input shapes, dtype and device names, the module, and the bytes allocated and freed
  while the event ran: the allocations logged between its start and its end (prefix sums over
  the memory log, one binary search per end), as a running counter read at both ends would give;
- memory: each device's bytes alive after every allocation and release, and its peak;
- "which range was open": the op a kernel launch ran in, the range a message finished in, the
  op or range a peak was reached in. The ranges nest (each ends before its caller), so one
  sweep over them in start order with a stack answers every such time at once.
"""
import bisect
from typing import Any, Dict, Iterable, List, Sequence, Tuple

from . import events as ev
from .events import (
    GRAD_FIELDS,
    MEMORY_FIELDS,
    MODULE_FIELDS,
    OP_FIELDS,
    Event,
    MemorySample,
    Peak,
    RankRecord,
)


def _rows(flat: List[Any], n: int) -> Iterable[Tuple[Any, ...]]:
    """A flat log's records, ``n`` entries each."""
    it = iter(flat)
    return zip(*[it] * n)


def build_record(rec: Any, rank: int, offset_ns: int) -> RankRecord:
    """``rec``'s (a ``ThreadRecorder``'s) logs as one rank's ``RankRecord``."""
    memory = sorted(_rows(rec.memory, MEMORY_FIELDS), key=lambda m: m[0])
    nbytes = _ByteCounter(memory, rec.profile_memory)
    events: List[Event] = []
    devices: Dict[int, str] = {}
    ops, grads, modules = (list(_rows(rec.ops, OP_FIELDS)), list(_rows(rec.grads, GRAD_FIELDS)),
                           list(_rows(rec.modules, MODULE_FIELDS)))
    for name, t0, t1, shapes, mod, dtype, device, _ in ops:
        args: Dict[str, Any] = {} if shapes is None else {"input_shapes": shapes}
        nbytes.fill(args, t0, t1)
        if mod is not None:
            args["module"] = mod
        if dtype is not None:
            args["dtype"] = str(dtype)
            args["device"] = devices.get(id(device)) or devices.setdefault(id(device),
                                                                            str(device))
        events.append(Event(name, ev.OP, t0, t1 - t0, args))
    for name, t0, t1, mod, _ in grads:
        args = {"module": mod}
        nbytes.fill(args, t0, t1)
        events.append(Event(name + "Backward", ev.BACKWARD, t0, t1 - t0, args))
    for path, t0, t1, _ in modules:
        args = {"module": path}
        nbytes.fill(args, t0, t1)
        events.append(Event(path, ev.MODULE, t0, t1 - t0, args))
    for name, cat, t0, t1, given, mod in rec.ranges:
        args = dict(given or {})
        nbytes.fill(args, t0, t1)
        if "module" not in args and mod is not None:
            args["module"] = mod
        events.append(Event(name, cat, t0, t1 - t0, args))
    open_at = _InnermostRange(events)
    kernel_ops = open_at.names(k[1] for k in rec.kernels)
    for (name, t0, t1, grid, block, index, emulated), op in zip(rec.kernels, kernel_ops):
        events.append(Event(name, ev.KERNEL, t0, t1 - t0, {
            "grid": grid, "block": block, "device": f"cuda:{index}", "emulated": emulated,
            "op": op, "time": "run on the CPU emulator" if emulated
            else "host launch (asynchronous)"}))
    during = open_at.names(t1 for _, t1 in rec.comms)
    for (r, t1), inside in zip(rec.comms, during):
        dur = int(r[6] * 1e9)
        events.append(Event(r[0], ev.COMM, t1 - dur, dur, {
            "algorithm": r[1], "label": r[2], "bytes_sent": int(r[3]), "bytes_recv": int(r[4]),
            "messages": int(r[5]), "peer": r[7] if len(r) > 7 else None, "during": inside}))
    events += [Event(name, cat, ts, -1, args) for name, cat, ts, args in rec.instants]
    samples, peaks = _memory(memory, open_at)
    n_ops = len(ops)
    overhead = (sum(o[7] - o[2] for o in ops) + sum(g[4] - g[2] for g in grads)
                + sum(m[3] - m[2] for m in modules))
    return RankRecord(rank, events, samples, peaks, offset_ns,
                      overhead / n_ops if n_ops else 0.0, n_ops, rec.dropped)


class _ByteCounter:
    """Bytes allocated and freed between two times, from the memory log sorted by time."""

    def __init__(self, memory: Sequence[Tuple[int, str, int]], on: bool = True) -> None:
        self.on = on  # memory was recorded
        self.times = [m[0] for m in memory]
        self.allocated, self.freed = [0], [0]   # prefix sums
        for _, _, delta in memory:
            self.allocated.append(self.allocated[-1] + max(delta, 0))
            self.freed.append(self.freed[-1] + max(-delta, 0))

    def fill(self, args: Dict[str, Any], t0: int, t1: int) -> None:
        """Set ``args``' "bytes_allocated" and "bytes_freed" for the interval [t0, t1]."""
        if not self.on:
            return
        if not self.times:
            args["bytes_allocated"] = args["bytes_freed"] = 0
            return
        i, j = bisect.bisect_left(self.times, t0), bisect.bisect_right(self.times, t1)
        args["bytes_allocated"] = self.allocated[j] - self.allocated[i]
        args["bytes_freed"] = self.freed[j] - self.freed[i]


class _InnermostRange:
    """The name of the innermost range (op, gradient, module, named range) open at a time."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.ranges = sorted(events, key=lambda e: (e.ts, -e.dur))

    def names(self, times: Iterable[int]) -> List[str]:
        """For each time, the innermost range open then ("" where none is)."""
        times = list(times)
        out = [""] * len(times)
        stack: List[Event] = []
        k = 0
        for i in sorted(range(len(times)), key=times.__getitem__):
            t = times[i]
            while k < len(self.ranges) and self.ranges[k].ts <= t:
                while stack and stack[-1].end < self.ranges[k].ts:
                    stack.pop()
                stack.append(self.ranges[k])
                k += 1
            while stack and stack[-1].end < t:
                stack.pop()
            out[i] = stack[-1].name if stack else ""
        return out


def _memory(memory: Sequence[Tuple[int, str, int]], open_at: _InnermostRange
            ) -> Tuple[List[MemorySample], Dict[str, Peak]]:
    """Bytes alive per device after each allocation and release; each device's peak."""
    now: Dict[str, int] = {}
    samples = []
    top: Dict[str, Tuple[int, int]] = {}  # device -> (bytes, ts) of its first highest point
    for ts, device, delta in memory:
        alive = now[device] = now.get(device, 0) + delta
        samples.append(MemorySample(ts, device, alive))
        if delta > 0 and (device not in top or alive > top[device][0]):
            top[device] = (alive, ts)
    at = open_at.names(ts for _, ts in top.values())
    peaks = {device: Peak(device, alive, ts, name)
             for (device, (alive, ts)), name in zip(top.items(), at)}
    return samples, peaks

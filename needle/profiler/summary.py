"""What a student reads in a terminal: ``key_averages().table(...)`` and ``summary()``.

Self time is an event's time minus that of the events directly inside it on the same track
(an op inside a module: the module's self time excludes the op). Memory columns are the bytes
allocated and freed while the event ran (``cpu_memory_usage`` is their difference, as in
torch.profiler, for every device: needle names the device in the op's args).
"""
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import events as ev
from .events import Event, RankRecord

SORT_KEYS = ("self_cpu_time_total", "cpu_time_total", "count", "cpu_memory_usage",
             "self_cpu_memory_usage", "bytes_allocated")


def self_times(events: Sequence[Event]) -> Dict[int, Tuple[int, int]]:
    """id(event) -> (self ns, self net bytes) for the timed events of each track."""
    out: Dict[int, Tuple[int, int]] = {}
    for track in (ev.MAIN, ev.KERNELS, ev.COMMS):
        timed = sorted((e for e in events if e.track == track and e.dur >= 0),
                       key=lambda e: (e.ts, -e.dur))
        _self_times_of(timed, out)
    return out


def _self_times_of(timed: List[Event], out: Dict[int, Tuple[int, int]]) -> None:
    """Self time and bytes of nested events sorted by (start, -duration), into ``out``."""
    stack: List[List[Any]] = []  # [event, child ns, child net bytes]
    for e in timed + [None]:  # type: ignore[list-item]
        while stack and (e is None or stack[-1][0].end <= e.ts):
            done, ns, nbytes = stack.pop()
            out[id(done)] = (done.dur - ns, _net(done) - nbytes)
        if e is None:
            return
        if stack:
            stack[-1][1] += e.dur
            stack[-1][2] += _net(e)
        stack.append([e, 0, 0])


def _net(e: Event) -> int:
    return int(e.args.get("bytes_allocated", 0)) - int(e.args.get("bytes_freed", 0))


class FunctionEventAvg:
    """The totals of every event with one key (name, and input shapes if grouped by them)."""

    def __init__(self, key: str, cat: str, input_shapes: str = "") -> None:
        self.key, self.cat, self.input_shapes = key, cat, input_shapes
        self.count = 0
        self.cpu_time_total = self.self_cpu_time_total = 0.0  # microseconds
        self.cpu_memory_usage = self.self_cpu_memory_usage = self.bytes_allocated = 0

    def add(self, e: Event, self_ns: int, self_bytes: int) -> None:
        """Count one more event."""
        self.count += 1
        self.cpu_time_total += e.dur / 1e3
        self.self_cpu_time_total += self_ns / 1e3
        self.cpu_memory_usage += _net(e)
        self.self_cpu_memory_usage += self_bytes
        self.bytes_allocated += int(e.args.get("bytes_allocated", 0))

    @property
    def cpu_time(self) -> float:
        """Mean time per call, microseconds."""
        return self.cpu_time_total / max(self.count, 1)


class EventList(list):
    """``FunctionEventAvg`` rows, with ``table()``."""

    def table(self, sort_by: str = "self_cpu_time_total", row_limit: int = 20) -> str:
        """A text table, ``row_limit`` rows, largest ``sort_by`` first."""
        if sort_by not in SORT_KEYS:
            raise ValueError(f"table: sort_by must be one of {SORT_KEYS}, got {sort_by!r}")
        rows = sorted(self, key=lambda r: -getattr(r, sort_by))[:row_limit]
        total_self = sum(r.self_cpu_time_total for r in self) or 1.0
        shapes = any(r.input_shapes for r in self)
        head = (f"{'Name':<40} {'Category':<12} {'Self us':>10} {'Self %':>7} {'Total us':>10} "
                f"{'Calls':>6} {'Avg us':>9} {'Alloc B':>11} {'Net B':>11}"
                + ("  Input shapes" if shapes else ""))
        lines = [head, "-" * len(head)]
        for r in rows:
            lines.append(f"{r.key[:40]:<40} {r.cat[:12]:<12} {r.self_cpu_time_total:>10.1f} "
                         f"{100 * r.self_cpu_time_total / total_self:>6.1f}% "
                         f"{r.cpu_time_total:>10.1f} {r.count:>6} {r.cpu_time:>9.1f} "
                         f"{r.bytes_allocated:>11} {r.cpu_memory_usage:>11}"
                         + (f"  {r.input_shapes}" if shapes else ""))
        lines.append(f"Self time total: {total_self / 1e3:.3f} ms")
        return "\n".join(lines)


def key_averages(events: Sequence[Event], group_by_input_shape: bool = False,
                 categories: Optional[Sequence[str]] = None) -> EventList:
    """Timed events grouped by name (and input shapes), with their totals."""
    selfs = self_times(events)
    groups: Dict[Tuple[str, str, str], FunctionEventAvg] = {}
    for e in events:
        if e.dur < 0 or (categories is not None and e.cat not in categories):
            continue
        shapes = str(e.args.get("input_shapes", "")) if group_by_input_shape else ""
        key = (e.name, e.cat, shapes)
        if key not in groups:
            groups[key] = FunctionEventAvg(e.name, e.cat, shapes)
        groups[key].add(e, *selfs[id(e)])
    return EventList(groups.values())


def _union(intervals: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    out: List[Tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(intervals: List[Tuple[int, int]]) -> int:
    return sum(b - a for a, b in intervals)


_COMPUTE = (ev.OP, ev.BACKWARD, ev.MODULE, ev.KERNEL, ev.PROGRAM_STEP)


def exposed_comm_ns(events: Sequence[Event]) -> int:
    """Time during which some message was in flight and no computation (module forward, op,
    gradient, kernel) ran (ns): the communication that computation did not hide."""
    comm = _union([(e.ts, e.end) for e in events if e.cat == ev.COMM])
    busy = _union([(e.ts, e.end) for e in events if e.cat in _COMPUTE])
    both = 0
    j = 0
    for a, b in comm:
        while j < len(busy) and busy[j][1] <= a:
            j += 1
        k = j
        while k < len(busy) and busy[k][0] < b:
            both += max(0, min(b, busy[k][1]) - max(a, busy[k][0]))
            k += 1
    return _length(comm) - both


def comm_table(events: Sequence[Event]) -> str:
    """Communication by kind: calls, bytes sent and received, time."""
    rows: Dict[Tuple[str, str], List[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    for e in events:
        if e.cat == ev.COMM:
            r = rows[(e.name, str(e.args.get("algorithm")))]
            r[0] += 1
            r[1] += e.args["bytes_sent"]
            r[2] += e.args["bytes_recv"]
            r[3] += e.dur / 1e6
    head = f"{'kind':<16} {'algorithm':<20} {'calls':>6} {'bytes_sent':>12} {'bytes_recv':>12} " \
           f"{'time ms':>9}"
    lines = [head, "-" * len(head)]
    for (name, algo), (calls, sent, recv, ms) in sorted(rows.items()):
        lines.append(f"{name:<16} {algo[:20]:<20} {calls:>6} {sent:>12} {recv:>12} {ms:>9.3f}")
    return "\n".join(lines)


def summary(rec: RankRecord, row_limit: int = 10) -> str:
    """Top ops by self time and by memory, the memory peaks, communication by kind, overhead."""
    ops = key_averages(rec.events, categories=(ev.OP,))

    def section(title: str) -> str:
        return f"\n== {title} (rank {rec.rank}) =="
    parts = [section("ops by self time"), ops.table("self_cpu_time_total", row_limit),
             section("ops by memory allocated"), ops.table("bytes_allocated", row_limit),
             section("memory peak")]
    for peak in rec.peaks.values():
        parts.append(f"{peak.device}: {peak.allocated} bytes allocated since profiling began, "
                     f"reached in {peak.at or '(no op)'}")
    if any(e.cat == ev.COMM for e in rec.events):
        parts += [section("communication by kind"), comm_table(rec.events),
                  f"exposed communication (no computation running): "
                  f"{exposed_comm_ns(rec.events) / 1e6:.3f} ms"]
    parts.append(f"\nprofiler overhead: {rec.overhead_ns_per_op / 1e3:.2f} us per op (its "
                 f"bookkeeping after each op, gradient and module call, over {rec.ops} ops; "
                 f"a module's time includes its ops')"
                 + (f"; {rec.dropped} events dropped" if rec.dropped else ""))
    return "\n".join(parts)

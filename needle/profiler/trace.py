"""Chrome trace event JSON (Perfetto, chrome://tracing) from the ranks' records.

One process per rank (``pid`` = rank, named "rank r"), with threads: "main" (modules, ops,
backward, data loading, optimizer steps, ``record_function``), "kernels" (CUDA kernel launches,
compiled programs' steps and fused kernels) and "comm k" lanes (every ledger record; calls that
overlap, like nonblocking gradient buckets, take separate lanes so each lane nests). Phases
used: "X" complete events (``ts``, ``dur`` in microseconds), "C" counters (bytes allocated per
device), "i" instants (the memory peak, bucket launches) and "M" metadata (names, order).
Each rank's times are shifted by its measured clock offset to rank 0's clock, then the whole
job's earliest event is time 0. Format: "Trace Event Format", Google, 2016 (the JSON Object
Format with ``traceEvents``).
"""
import json
from typing import Any, Dict, List, Sequence, Tuple

from . import events as ev
from .events import Event, RankRecord

MAIN_TID, KERNELS_TID, COMM_TID = 0, 1, 2
THREAD_NAMES = {MAIN_TID: "main (ops, modules, steps)", KERNELS_TID: "kernels"}


def _us(ns: int) -> float:
    return ns / 1000.0


def _comm_lanes(events: Sequence[Event]) -> List[int]:
    """A lane per comm event such that events in one lane do not overlap (first fit)."""
    ends: List[int] = []
    lanes = []
    for e in events:
        for i, end in enumerate(ends):
            if end <= e.ts:
                ends[i] = e.end
                lanes.append(i)
                break
        else:
            ends.append(e.end)
            lanes.append(len(ends) - 1)
    return lanes


def _timed_events(rec: RankRecord, t0: int) -> Tuple[List[Dict[str, Any]], int]:
    """The rank's "X" and "i" events (the memory peaks too), sorted per thread; and the number
    of comm lanes."""
    shift = t0 + rec.offset_ns
    order = sorted(rec.events, key=lambda e: (e.ts, -e.dur))
    comms = [e for e in order if e.track == ev.COMMS]
    lane_of = {id(e): lane for e, lane in zip(comms, _comm_lanes(comms))}
    out = []
    for e in order:
        tid = {ev.MAIN: MAIN_TID, ev.KERNELS: KERNELS_TID}.get(e.track)
        if tid is None:
            tid = COMM_TID + lane_of[id(e)]
        item: Dict[str, Any] = {"name": e.name, "cat": e.cat, "pid": rec.rank, "tid": tid,
                                "ts": _us(e.ts - shift), "args": e.args}
        if e.dur < 0:
            item.update(ph="i", s="t")
        else:
            item.update(ph="X", dur=_us(e.dur))
        out.append(item)
    for peak in rec.peaks.values():
        out.append({"name": f"peak memory {peak.device}", "ph": "i", "s": "p", "pid": rec.rank,
                    "tid": MAIN_TID, "ts": _us(peak.ts - shift), "cat": "memory",
                    "args": {"bytes": peak.allocated, "during": peak.at}})
    out.sort(key=lambda d: (d["tid"], d["ts"], -d.get("dur", 0.0)))
    return out, len(set(lane_of.values()))


def _memory_events(rec: RankRecord, t0: int) -> List[Dict[str, Any]]:
    """Counters of bytes allocated per device (the peak is an instant among the events)."""
    shift = t0 + rec.offset_ns
    return [{"name": f"memory {s.device}", "ph": "C", "pid": rec.rank, "tid": MAIN_TID,
             "ts": _us(s.ts - shift), "args": {"allocated bytes": s.allocated}}
            for s in sorted(rec.samples, key=lambda s: s.ts)]


def _metadata(rank: int, lanes: int) -> List[Dict[str, Any]]:
    meta: List[Dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
         "args": {"name": f"rank {rank}"}},
        {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
         "args": {"sort_index": rank}}]
    names = dict(THREAD_NAMES)
    names.update({COMM_TID + k: f"comm {k}" for k in range(lanes)})
    for tid, name in names.items():
        meta.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                     "args": {"name": name}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid,
                     "args": {"sort_index": tid}})
    return meta


def start_time(records: Sequence[RankRecord]) -> int:
    """The job's earliest event or sample on rank 0's clock (ns): the trace's time 0."""
    starts = [e.ts - r.offset_ns for r in records for e in r.events]
    starts += [s.ts - r.offset_ns for r in records for s in r.samples]
    return min(starts, default=0)


def chrome_trace(records: Sequence[RankRecord]) -> Dict[str, Any]:
    """The JSON object of a trace with one process per rank."""
    t0 = start_time(records)
    out: List[Dict[str, Any]] = []
    for rec in sorted(records, key=lambda r: r.rank):
        timed, lanes = _timed_events(rec, t0)
        out += _metadata(rec.rank, lanes) + timed + _memory_events(rec, t0)
    other = {f"rank {r.rank}": {"clock_offset_ns": r.offset_ns, "ops": r.ops,
                                "profiler_overhead_us_per_op": r.overhead_ns_per_op / 1e3,
                                "events_dropped": r.dropped} for r in records}
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": other}


def write(records: Sequence[RankRecord], path: str) -> str:
    """Write the trace of ``records`` to ``path`` (JSON); returns ``path``."""
    with open(path, "w") as f:
        json.dump(chrome_trace(records), f, default=str)
    return path

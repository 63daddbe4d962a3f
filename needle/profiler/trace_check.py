"""Check a Chrome trace against the event format, so a broken trace fails before Perfetto.

Checked, per the Trace Event Format (Google, 2016): the object has a ``traceEvents`` list;
every event has ``name`` (str), ``ph`` (one of the phases needle writes), ``pid`` and ``tid``
(int); "X" has numeric ``ts`` and ``dur >= 0``; "i" has ``ts`` and a scope ``s`` in g/p/t;
"C" has ``ts`` and ``args`` of numbers; "M" names a process or thread (``args.name``) or sets a
sort index (``args.sort_index``). Timestamps never decrease along one thread (X and i) or one
counter, and the X events of one thread nest: each one ends before the one it started inside.
"""
import json
from numbers import Real
from typing import Any, Dict, List, Tuple, Union

PHASES = ("X", "C", "i", "M")
METADATA = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
            "thread_sort_index": "sort_index"}
SLACK_US = 1e-3  # float rounding of nanosecond times written in microseconds


class TraceFormatError(ValueError):
    """A trace that does not follow the Chrome trace event format."""


def _num(x: Any) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


def _check_event(i: int, e: Any) -> None:
    """Keys and types of event ``i``, by phase."""
    if not isinstance(e, dict):
        raise TraceFormatError(f"traceEvents[{i}]: an event must be a JSON object, got {e!r}")
    why = _common_problem(e) or _phase_problem(e)
    if why:
        raise TraceFormatError(f"traceEvents[{i}] ({e.get('name', '?')}): {why}")


def _common_problem(e: Dict[str, Any]) -> str:
    """What is wrong with the keys every event has ("" if nothing)."""
    for key, kind in (("name", str), ("ph", str), ("pid", int), ("tid", int)):
        if not isinstance(e.get(key), kind) or isinstance(e.get(key), bool):
            return f"needs {key!r} of type {kind.__name__}, got {e.get(key)!r}"
    if e["ph"] not in PHASES:
        return f"phase {e['ph']!r} is not one of {PHASES}"
    if e["ph"] != "M" and not _num(e.get("ts")):
        return f"phase {e['ph']!r} needs a numeric 'ts', got {e.get('ts')!r}"
    return ""


def _phase_problem(e: Dict[str, Any]) -> str:
    """What is wrong with the keys of the event's phase ("" if nothing)."""
    ph, args = e["ph"], e.get("args")
    if ph == "X" and not (_num(e.get("dur")) and e["dur"] >= 0):
        return f"an 'X' event needs a numeric 'dur' >= 0, got {e.get('dur')!r}"
    if ph == "i" and e.get("s", "t") not in ("g", "p", "t"):
        return f"an 'i' event's scope 's' must be 'g', 'p' or 't', got {e.get('s')!r}"
    if ph == "C" and (not isinstance(args, dict) or not args
                      or not all(map(_num, args.values()))):
        return f"a 'C' event needs 'args' of numbers, got {args!r}"
    if ph == "M":
        want = METADATA.get(e["name"])
        if want is None:
            return f"metadata name must be one of {sorted(METADATA)}"
        if not isinstance(args, dict) or want not in args:
            return f"metadata {e['name']!r} needs args.{want}"
    return ""


def _check_order(events: List[Dict[str, Any]]) -> None:
    """Times never decrease per thread and per counter; X events nest per thread."""
    last: Dict[Tuple, float] = {}
    open_: Dict[Tuple, List[Tuple[float, int]]] = {}
    for i, e in enumerate(events):
        if e["ph"] == "M":
            continue
        key = (e["pid"], e["tid"]) if e["ph"] != "C" else (e["pid"], "C", e["name"])
        if e["ts"] < last.get(key, float("-inf")):
            raise TraceFormatError(f"traceEvents[{i}] ({e['name']}): ts {e['ts']} is before "
                                   f"the previous event's {last[key]} on pid {e['pid']} "
                                   f"tid {e['tid']}")
        last[key] = e["ts"]
        if e["ph"] != "X":
            continue
        stack = open_.setdefault(key, [])
        while stack and stack[-1][0] <= e["ts"] + SLACK_US:
            stack.pop()
        end = e["ts"] + e["dur"]
        if stack and end > stack[-1][0] + SLACK_US:
            j = stack[-1][1]
            raise TraceFormatError(f"traceEvents[{i}] ({e['name']}) ends at {end} after the "
                                   f"event it starts in, traceEvents[{j}] "
                                   f"({events[j]['name']}), ends at {stack[-1][0]}")
        stack.append((end, i))


def check_trace(trace: Union[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Raise ``TraceFormatError`` naming the first bad event; returns the trace object.

    ``trace``: a trace object, or the path of a JSON trace file."""
    if isinstance(trace, str):
        with open(trace) as f:
            trace = json.load(f)
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TraceFormatError("a trace must be a JSON object with a 'traceEvents' list")
    events = trace["traceEvents"]
    for i, e in enumerate(events):
        _check_event(i, e)
    _check_order(events)
    return trace

"""Figures for notebooks: a step's timeline per rank, and memory over time (matplotlib).

Both read a Chrome trace (the object ``chrome_trace`` returns, or the path of a written
file), so a trace written under mpiexec can be drawn in a notebook afterwards.
"""
import json
from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple, Union

from .trace import COMM_TID, KERNELS_TID, MAIN_TID

Trace = Union[str, Dict[str, Any]]
COLORS = {"module": "tab:blue", "op": "tab:cyan", "backward": "tab:orange",
          "optimizer": "tab:green", "dataloader": "tab:purple", "user_annotation": "tab:gray",
          "profiler_step": "lightgray", "compiled_program": "tab:olive", "kernel": "tab:brown",
          "program_step": "tab:brown", "comm": "tab:red"}


def _load(trace: Trace) -> Dict[str, Any]:
    if isinstance(trace, str):
        with open(trace) as f:
            return json.load(f)
    return trace


def _outermost(events: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The X events of one thread not inside another (the rows' coarse view)."""
    out: List[Dict[str, Any]] = []
    end = float("-inf")
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def _rows(trace: Dict[str, Any], depth_cats: Tuple[str, ...]) -> Dict[Tuple[int, str], list]:
    """(rank, row name) -> X events drawn on that row."""
    per: Dict[Tuple[int, int], List[Dict[str, Any]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            per[(e["pid"], e["tid"])].append(e)
    rows: Dict[Tuple[int, str], list] = {}
    for (pid, tid), evs in sorted(per.items()):
        if tid == MAIN_TID:
            rows[(pid, "compute")] = [e for e in evs if e.get("cat") in depth_cats]
        elif tid == KERNELS_TID:
            rows[(pid, "kernels")] = _outermost(evs)
        elif tid >= COMM_TID:
            rows.setdefault((pid, "comm"), []).extend(evs)
    return rows


def plot_timeline(trace: Trace, ax: Any = None, cats: Tuple[str, ...] = ("module", "backward",
                  "optimizer", "dataloader")) -> Any:
    """Per rank: rows of compute (events of ``cats``), kernels and messages over time (ms)."""
    import matplotlib.pyplot as plt
    trace = _load(trace)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3))
    rows = _rows(trace, cats)
    labels = []
    for y, ((pid, name), evs) in enumerate(sorted(rows.items())):
        labels.append(f"rank {pid} {name}")
        for e in evs:
            ax.broken_barh([(e["ts"] / 1e3, max(e["dur"], 1.0) / 1e3)], (y - 0.4, 0.8),
                           color=COLORS.get(e.get("cat", ""), "black"))
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[c]) for c in cats + ("comm",)
               if c in COLORS]
    ax.legend(handles, list(cats) + ["comm"], loc="upper right", fontsize="small")
    return ax


def plot_memory(trace: Trace, ax: Any = None, device: Optional[str] = None) -> Any:
    """Bytes allocated (since profiling began) over time, one line per rank and device, the
    peaks marked."""
    import matplotlib.pyplot as plt
    trace = _load(trace)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3))
    lines: Dict[Tuple[int, str], List[Tuple[float, float]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "C" and (device is None or e["name"] == f"memory {device}"):
            lines[(e["pid"], e["name"])].append((e["ts"] / 1e3, next(iter(e["args"].values()))))
        if e["ph"] == "i" and e["name"].startswith("peak memory"):
            ax.plot([e["ts"] / 1e3], [e["args"]["bytes"]], "v", color="black")
    for (pid, name), pts in sorted(lines.items()):
        ax.step([t for t, _ in pts], [b for _, b in pts], where="post",
                label=f"rank {pid} {name}")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("bytes allocated")
    ax.legend(fontsize="small")
    return ax

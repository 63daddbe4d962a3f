"""Pipeline timelines as Chrome-trace JSON (opens in Perfetto / chrome://tracing) and as a
matplotlib Gantt chart, the simulator's prediction above the executor's measurement."""
import json
from typing import List, Optional, Sequence, Tuple

__all__ = ["chrome_trace", "write_chrome_trace", "plot_gantt"]

Events = Sequence[Sequence[Tuple[tuple, float, float]]]   # per stage: (action, start, end)


def chrome_trace(events: Events, process: str = "pipeline", pid: int = 0,
                 scale: float = 1e6) -> List[dict]:
    """Complete ("X") events, one thread per stage; times multiplied by ``scale`` to µs."""
    out = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": process}}]
    for s, stage in enumerate(events):
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": s,
                    "args": {"name": f"stage {s}"}})
        for act, start, end in stage:
            name = f"{act[0]}{act[1]}" + (f".{act[2]}" if len(act) > 2 else "")
            out.append({"name": name, "cat": act[0], "ph": "X", "pid": pid, "tid": s,
                        "ts": start * scale, "dur": (end - start) * scale})
    return out


def write_chrome_trace(path: str, predicted: Optional[Events] = None,
                       measured: Optional[Events] = None, unit: float = 1e-3) -> None:
    """Write predicted (``unit`` seconds per cost unit) and measured timelines to one trace."""
    trace = []
    if predicted is not None:
        trace += chrome_trace(predicted, "predicted", 0, 1e6 * unit)
    if measured is not None:
        trace += chrome_trace(measured, "measured", 1)
    with open(path, "w") as f:
        json.dump({"traceEvents": trace, "displayTimeUnit": "ms"}, f)


def plot_gantt(path: str, predicted: Events, measured: Optional[Events] = None,
               title: str = "") -> None:
    """Gantt chart PNG: one row per stage, forwards blue, backwards green, idle blank."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("predicted (cost units)", predicted)]
    if measured is not None:
        panels.append(("measured (ms)", [[(a, b * 1e3, e * 1e3) for a, b, e in st]
                                         for st in measured]))
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.2 + 0.5 * len(predicted) *
                                                      len(panels)), squeeze=False)
    for ax, (label, events) in zip(axes[:, 0], panels):
        for s, stage in enumerate(events):
            for act, b, e in stage:
                color = "#4c72b0" if act[0] == "F" else "#55a868"
                if len(act) > 2 and act[2] % 2:
                    color = "#8da0cb" if act[0] == "F" else "#a6d854"
                ax.broken_barh([(b, e - b)], (s - 0.4, 0.8), facecolors=color,
                               edgecolors="white", linewidth=0.5)
                if e - b > 0:
                    ax.text((b + e) / 2, s, f"{act[0]}{act[1]}", ha="center", va="center",
                            fontsize=6, color="white")
        ax.set_yticks(range(len(events)))
        ax.set_yticklabels([f"stage {s}" for s in range(len(events))])
        ax.invert_yaxis()
        ax.set_xlabel(label)
    if title:
        axes[0, 0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

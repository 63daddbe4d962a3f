"""Predict every layout and order them: fitting ones by predicted step time (fastest first; by
memory when only a parameter count is known), then the rest with why not."""
from dataclasses import replace
from typing import List, Optional, Tuple

from .candidates import check_layout, enumerate_layouts
from .cluster import ClusterSpec
from .layout import Layout, Setup
from .model import ModelSpec
from .predict import Prediction, predict

__all__ = ["plan"]


def _key(p: Prediction) -> Tuple[float, ...]:
    """Fastest first; by memory, then the simplest layout, when there is no step time."""
    t = p.step_seconds if p.step_seconds == p.step_seconds else 0.0
    lay = p.layout
    return (t, round(p.memory["total"], -6), lay.tp * lay.pp, lay.zero, lay.microbatch)


def plan(spec: ModelSpec, setup: Setup, cluster: ClusterSpec, microbatch: Optional[int] = None,
         layouts: Optional[List[Layout]] = None) -> List[Prediction]:
    """Predictions for every layout (or ``layouts``), fitting ones best first; ``precision="any"``
    merges the fp32 and mixed-precision lists."""
    if setup.precision == "any":
        both = [plan(spec, replace(setup, precision=p), cluster, microbatch, layouts)
                for p in ("mixed", "fp32")]
        preds = [p for ps in both for p in ps]
        fit = sorted((p for p in preds if p.fits), key=_key)
        return fit + [p for p in preds if not p.fits]
    spec, setup, cluster = spec.check(), setup.check(), cluster.check()
    if microbatch is not None and (not isinstance(microbatch, int) or microbatch < 1):
        raise ValueError(f"microbatch must be a positive integer, got {microbatch!r}")
    if setup.batch % (microbatch or 1):
        raise ValueError(f"batch={setup.batch} is not divisible by microbatch={microbatch}")
    rejected: List[Tuple[Layout, str]] = []
    if layouts is None:
        layouts, rejected = enumerate_layouts(spec, setup, cluster, microbatch)
    else:
        for lay in layouts:
            check_layout(spec, lay, setup, cluster)
    preds = [predict(spec, lay, setup, cluster, time_unfit=False) for lay in layouts]
    fit = sorted((p for p in preds if p.fits), key=_key)
    rest = sorted((p for p in preds if not p.fits), key=lambda p: p.memory["total"])
    return fit + rest + [Prediction(lay, {"total": float("nan")}, False, why_not=why,
                                    precision=setup.precision) for lay, why in rejected]

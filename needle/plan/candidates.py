"""Every layout worth predicting for a model, a set-up and a cluster, and why others are out
(tp within a node, pp dividing the layers, ZeRO 0-1 with pp > 1 as DeepSpeed)."""
import math
from typing import Iterator, List, Optional, Tuple

from ..parallel.pipeline.schedules import SCHEDULES
from .cluster import ClusterSpec
from .layout import RECOMPUTE, Layout, Setup
from .model import ModelSpec

__all__ = ["enumerate_layouts", "check_layout", "divisors"]


def divisors(n: int) -> List[int]:
    """The positive divisors of n, ascending (pairs d, n // d with d <= sqrt n)."""
    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return low + [n // d for d in reversed(low) if d * d != n]


def check_layout(spec: ModelSpec, lay: Layout, setup: Setup, cluster: ClusterSpec) -> None:
    """Raise ValueError naming the field and the rule the layout breaks."""
    for name in ("dp", "tp", "pp", "microbatch", "chunks"):
        v = getattr(lay, name)
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if lay.gpus > cluster.gpus:
        raise ValueError(f"dp x tp x pp = {lay.dp} x {lay.tp} x {lay.pp} = {lay.gpus} is more "
                         f"than the cluster's {cluster.gpus} GPUs")
    if lay.tp > cluster.gpus_per_node:
        raise ValueError(f"TP across nodes: tp={lay.tp} is larger than a node "
                         f"({cluster.gpus_per_node} GPUs per node)")
    if setup.batch % (lay.dp * lay.microbatch):
        raise ValueError(f"batch={setup.batch} is not divisible by dp x microbatch = "
                         f"{lay.dp} x {lay.microbatch}")
    if lay.zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3, got {lay.zero!r}")
    if spec.is_transformer:
        _check_transformer_layout(spec, lay, setup)


def _check_transformer_layout(spec: ModelSpec, lay: Layout, setup: Setup) -> None:
    """tp divides heads, pp x chunks divides layers, and interleaved m is a multiple of pp."""
    if spec.heads % lay.tp:
        raise ValueError(f"tp={lay.tp} must divide heads={spec.heads}")
    if spec.layers % (lay.pp * lay.chunks):
        raise ValueError(f"pp x chunks = {lay.pp} x {lay.chunks} must divide "
                         f"layers={spec.layers}")
    m = setup.batch // (lay.dp * lay.microbatch)
    if lay.schedule == "interleaved" and lay.pp > 1 and m % lay.pp:
        raise ValueError(f"interleaved needs microbatches m={m} to be a multiple of "
                         f"pp={lay.pp}")


def _model_grid(spec: ModelSpec, gpus: int, gpn: int) -> Iterator[Tuple[int, int, int]]:
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if gpus % t == 0 and t <= max(gpn * 2, 1)]
    pps = divisors(spec.layers) if spec.is_transformer else [1]
    for tp in tps:
        for pp in pps:
            if gpus % (tp * pp) == 0:
                yield gpus // (tp * pp), tp, pp


def _schedules() -> List[str]:
    """The pipeline's schedules, the default first (ties in the ranking keep the first)."""
    return sorted(SCHEDULES, key=lambda name: name != Layout.schedule)


def _choices(spec: ModelSpec, dp: int, tp: int, pp: int, setup: Setup,
             microbatch: Optional[int]) -> Iterator[Layout]:
    per = setup.batch // dp if setup.batch % dp == 0 else 0
    mbs = [microbatch] if microbatch else [b for b in (1, 2, 4, 8) if per and per % b == 0]
    mbs = mbs if spec.is_transformer else mbs[:1]
    zeros = ([0, 1] if pp > 1 else [0, 1, 2, 3]) if dp > 1 else [0]
    scheds = [(s, 2 if s == "interleaved" else 1) for s in _schedules()] if pp > 1 \
        else [(Layout.schedule, 1)]
    recs = RECOMPUTE if spec.is_transformer else ("none",)
    for mb in mbs or [microbatch or 1]:
        for z in zeros:
            for sp in ([False, True] if tp > 1 and spec.is_transformer else [False]):
                for sched, v in scheds:
                    for rec in recs:
                        for off in ([False, True] if z in (1, 2) and pp == 1 else [False]):
                            yield Layout(dp, tp, pp, z, sp, sched, v, rec, mb, off)


def enumerate_layouts(spec: ModelSpec, setup: Setup, cluster: ClusterSpec,
                      microbatch: Optional[int] = None
                      ) -> Tuple[List[Layout], List[Tuple[Layout, str]]]:
    """(valid layouts, [(rejected layout, why)]) over the grid above."""
    ok: List[Layout] = []
    rejected: List[Tuple[Layout, str]] = []
    for dp, tp, pp in _model_grid(spec, cluster.gpus, cluster.gpus_per_node):
        for lay in _choices(spec, dp, tp, pp, setup, microbatch):
            try:
                check_layout(spec, lay, setup, cluster)
            except ValueError as err:
                rejected.append((lay, str(err)))
                continue
            ok.append(lay)
    return ok, rejected

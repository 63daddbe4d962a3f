"""A layout's prediction: memory by category, step time (compute, communication, bubble),
whether it fits, MFU and tokens/s.

Step time on the busiest GPU:
  compute   F / (dp tp pp) / (peak x efficiency), F from ``model.training_flops`` (recompute
            included), split per microbatch into forward (1/3) and backward (2/3; + a forward
            with full recomputation);
  tp        alpha-beta time of the tensor-parallel collectives, on the critical path (no overlap:
            Megatron's allreduces wait for the matmul before and block the one after);
  pipeline  the schedule simulator's makespan with those per-microbatch costs and the p2p
            message time between stages (the bubble is what it adds over m (F + B));
  dp        assumed to overlap with backward when pp = 1 (DDP / ZeRO bucket hooks): only the part
            longer than backward is exposed; with pp > 1 it runs after the pipeline flush and is
            exposed in full; ZeRO-3's forward allgathers overlap the forward the same way;
            nothing overlaps on a cluster with ``overlap=False`` (``--cluster here``);
  offload   PCIe transfers of the gradients and parameters plus the CPU's optimizer step.
"""
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from .bubble import pipeline_seconds
from .cluster import ClusterSpec
from .comm_time import Collective, comm_seconds, layout_collectives, step_bytes
from .gpu_memory import per_gpu_bytes
from .layout import Layout, Setup
from .model import ModelSpec, training_flops

__all__ = ["Prediction", "predict"]


@dataclass
class Prediction:
    """Everything the planner says about one layout."""

    layout: Layout
    memory: Dict[str, float]
    fits: bool
    step_seconds: float = float("nan")
    parts: Dict[str, float] = field(default_factory=dict)
    bytes_per_step: float = 0.0
    mfu: float = float("nan")
    flops_per_gpu: float = float("nan")   # achieved FLOP/s per GPU, recomputation counted
    tokens_per_s: float = float("nan")
    why_not: Optional[str] = None
    precision: str = ""

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict (the ``--json`` item)."""
        return {"strategy": self.layout.strategy, **asdict(self.layout),
                "precision": self.precision,
                "name": self.layout.describe() + (f" {self.precision}" if self.precision else ""),
                "memory_bytes": self.memory, "total_bytes": self.memory["total"],
                "fits": self.fits, "why_not": self.why_not, "step_seconds": self.step_seconds,
                "time_parts": self.parts, "bytes_sent_per_step": self.bytes_per_step,
                "mfu": self.mfu, "flops_per_gpu": self.flops_per_gpu,
                "tokens_per_s": self.tokens_per_s}


def _sum(cs: List[Collective], cluster: ClusterSpec, lay: Layout, **match: str) -> float:
    return sum(comm_seconds(c, cluster, lay) for c in cs
               if all(getattr(c, k) == v for k, v in match.items()))


def _step_time(spec: ModelSpec, lay: Layout, setup: Setup, cluster: ClusterSpec,
               cs: List[Collective]) -> Dict[str, float]:
    """Seconds by part (see the module docstring) and in all (``step``)."""
    rate = cluster.peak_flops[setup.precision] * cluster.efficiency
    m = setup.batch // (lay.dp * lay.microbatch)
    flops = training_flops(spec, setup.batch, lay.recompute) / lay.gpus
    plain = training_flops(spec, setup.batch, "none") / lay.gpus
    fwd = plain / 3 / m / rate                           # one microbatch on one stage
    bwd = (flops - plain / 3) / m / rate
    tp = _sum(cs, cluster, lay, group="tp") / m           # per microbatch on one stage
    tp_f = tp * 2 / (6 if lay.recompute == "full" else 4)  # the forward's 2 collectives
    f, b = fwd + tp_f, bwd + tp - tp_f
    p2p = sum(comm_seconds(c, cluster, lay) / c.calls for c in cs if c.group == "pp")  # 1 msg
    pipe = pipeline_seconds(lay.schedule, lay.pp, m, f, b, p2p, lay.chunks)
    dp_bwd = _sum(cs, cluster, lay, group="dp", overlap="backward")
    dp_fwd = _sum(cs, cluster, lay, group="dp", overlap="forward")
    dp_rest = _sum(cs, cluster, lay, group="dp", overlap="")
    if cluster.overlap:
        exposed = max(0.0, dp_bwd - m * bwd) + max(0.0, dp_fwd - m * fwd) + dp_rest
    else:
        exposed = dp_bwd + dp_fwd + dp_rest
    parts = {"compute": m * (fwd + bwd), "tp_comm": m * tp,
             "bubble_and_p2p": pipe - m * (f + b), "dp_comm": dp_bwd + dp_fwd + dp_rest,
             "dp_exposed": exposed, "offload": 0.0}
    if lay.offload:
        psi = spec.num_params / (lay.tp * lay.pp * lay.dp)
        e = 2 if setup.precision == "mixed" else 4
        parts["offload"] = 2 * e * psi * cluster.host_beta + psi / cluster.host_adam_rate
    parts["step"] = pipe + exposed + parts["offload"]
    return parts


def predict(spec: ModelSpec, lay: Layout, setup: Setup, cluster: ClusterSpec,
            time_unfit: bool = True) -> Prediction:
    """Memory, fit, and (for transformer shapes; with ``time_unfit=False`` only when ``lay``
    fits) step time, MFU and tokens/s of ``lay``."""
    mem = per_gpu_bytes(spec, lay, setup)
    fits = mem["total"] <= cluster.gpu_memory
    pred = Prediction(lay, mem, fits, precision=setup.precision)
    if not fits:
        pred.why_not = (f"does not fit: {mem['total'] / 1e9:.1f} GB > "
                        f"{cluster.gpu_memory / 1e9:.0f} GB")
        if not time_unfit:
            return pred
    cs = layout_collectives(spec, lay, setup)
    pred.bytes_per_step = step_bytes(cs)
    if not spec.is_transformer:
        return pred
    parts = _step_time(spec, lay, setup, cluster, cs)
    t = parts["step"]
    pred.step_seconds, pred.parts = t, parts
    model = training_flops(spec, setup.batch, "none")
    pred.mfu = model / (t * lay.gpus * cluster.peak_flops[setup.precision])
    pred.flops_per_gpu = training_flops(spec, setup.batch, lay.recompute) / (t * lay.gpus)
    pred.tokens_per_s = setup.batch * spec.seq / t
    return pred

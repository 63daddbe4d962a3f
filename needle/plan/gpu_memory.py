"""Per-GPU bytes of a layout by category: parameters, gradients, optimizer state, activations,
buffers (and, with offload, what lives on the host instead).

Model states and per-layer activations come from ``needle.memory.estimator``; this adds what a
layout changes (Korthikanti et al., arXiv:2205.05198): the first stage of 1F1B keeps L layers'
worth, GPipe m L / p, interleaved L (1 + (p - 1) / (p v)) (sec. 4.2.3); selective recomputation
keeps s b h (10 + 24 / t), 34 s b h / t with SP (sec. 5); buffers (25 MiB gradient buckets,
ZeRO-3's two prefetched layers, two pipeline messages); offload moves optimizer state to the host.
"""
from functools import lru_cache
from typing import Dict, Tuple

from ..memory.estimator import estimate_transformer, layer_activation_bytes, optimizer_state_bytes
from .layout import Layout, Setup
from .model import ModelSpec

__all__ = ["CATEGORIES", "per_gpu_bytes", "model_state_bytes", "activation_layer_bytes",
           "in_flight_microbatches"]

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "buffers")
BUCKET = 25 * 2 ** 20


def model_state_bytes(psi: float, optimizer: str, precision: str, zero: int,
                      dp: int) -> Dict[str, float]:
    """ZeRO's model states for Psi parameters on one GPU (Rajbhandari et al., sec. 3)."""
    P = 2.0 if precision == "mixed" else 4.0
    k, _ = optimizer_state_bytes([(1,)], optimizer, precision)  # bytes per parameter, K
    return {"parameters": P * psi / (dp if zero >= 3 else 1),
            "gradients": P * psi / (dp if zero >= 2 else 1),
            "optimizer_state": k * psi / (dp if zero >= 1 else 1)}


def activation_layer_bytes(spec: ModelSpec, b: int, t: int, sp: bool, recompute: str,
                           e: int = 2, dropout: bool = True) -> float:
    """``estimator.layer_activation_bytes`` for ``spec`` at microbatch ``b``."""
    return layer_activation_bytes(spec.seq, b, spec.hidden, spec.heads, t, sp, recompute, e,
                                  dropout)


@lru_cache(maxsize=4096)
def _estimator_terms(spec: ModelSpec, mb: int, precision: str, optimizer: str, zero: int,
                     dp: int, tp: int, pp: int) -> Tuple[Tuple[float, float, float], float]:
    """((parameters, gradients, optimizer state), output head) from the estimator, cached."""
    est = estimate_transformer(spec.config(mb), precision=precision, optimizer=optimizer,
                               zero_stage=zero, dp=dp, tp=tp, pp=pp)
    return (est["parameters"], est["gradients"], est["optimizer_state"]), est["output_head"]


def in_flight_microbatches(schedule: str, p: int, m: int, stage: int = 0) -> int:
    """Microbatches whose activations ``stage`` holds at once: m under GPipe, min(p - stage, m)
    under 1F1B (Narayanan et al., sec. 2.2)."""
    if not 0 <= stage < p or m < 1:
        raise ValueError(f"stage must be in [0, {p}) and m >= 1, got stage {stage}, m {m}")
    return m if schedule == "gpipe" else min(p - stage, m)


def _in_flight_layers(spec: ModelSpec, lay: Layout, setup: Setup) -> float:
    """Layers' worth of microbatch activations the busiest stage holds at once."""
    L, p = spec.layers, lay.pp
    if p == 1:
        return float(L)
    m = setup.batch // (lay.dp * lay.microbatch)
    if lay.schedule == "interleaved":
        return L * (1 + (p - 1) / (p * lay.chunks))
    return L / p * in_flight_microbatches(lay.schedule, p, m)


def per_gpu_bytes(spec: ModelSpec, lay: Layout, setup: Setup) -> Dict[str, float]:
    """Bytes on the busiest GPU by category, plus ``host`` (offloaded) and ``total``."""
    e = 2 if setup.precision == "mixed" else 4
    if spec.is_transformer:
        states, head = _estimator_terms(spec, lay.microbatch, setup.precision,
                                        setup.optimizer, lay.zero, lay.dp, lay.tp, lay.pp)
        out = dict(zip(("parameters", "gradients", "optimizer_state"), states))
        layer = activation_layer_bytes(spec, lay.microbatch, lay.tp, lay.sp, lay.recompute, e)
        act = layer * _in_flight_layers(spec, lay, setup)
        if lay.recompute == "full":  # one layer is rebuilt in full during its backward
            act += activation_layer_bytes(spec, lay.microbatch, lay.tp, lay.sp, "none", e)
        if lay.pp == 1:
            act += head
        out["activations"] = act
        sbh = spec.seq * lay.microbatch * spec.hidden * e
        layer_params = 12 * spec.hidden ** 2 / lay.tp * e
    else:
        out = model_state_bytes(spec.num_params / (lay.tp * lay.pp), setup.optimizer,
                                setup.precision, lay.zero, lay.dp)
        out["activations"] = 0.0
        sbh, layer_params = 0.0, 0.0
    buffers = 0.0
    if lay.dp > 1 and lay.zero < 3:
        buffers += BUCKET
    if lay.dp > 1 and lay.zero == 3:
        buffers += 2 * layer_params
    if lay.pp > 1:
        buffers += 2 * sbh / (lay.tp if lay.sp else 1)
    out["buffers"] = buffers
    out["host"] = 0.0
    if lay.offload:
        out["host"], out["optimizer_state"] = out["optimizer_state"], 0.0
    out["total"] = sum(out[c] for c in CATEGORIES)
    return out

"""Training-memory estimates from published formulas, printed term by term.

Model states (per device), with Psi parameters, P/G bytes per parameter and gradient and K bytes
of optimizer state per parameter (Rajbhandari et al., "ZeRO", arXiv:1910.02054, sec. 3;
EleutherAI, "Transformer Math 101", 2023):

    fp32 : P = 4, G = 4;  K = 8 (Adam/AdamW m, v), 4 (SGD momentum), factored (Adafactor)
    mixed: P = 2, G = 2;  K = 4 (fp32 master) + the fp32 optimizer state (Adam: K = 12)
    ZeRO-0: (P + G + K) Psi     ZeRO-1: (P + G) Psi + K Psi / Nd
    ZeRO-2: P Psi + (G + K) Psi / Nd                   ZeRO-3: (P + G + K) Psi / Nd
    (mixed Adam: 16 Psi, 4 Psi + 12 Psi/Nd, 2 Psi + 14 Psi/Nd, 16 Psi/Nd)
with tensor/pipeline parallel degrees t, p dividing Psi first (Psi / (t p)).

Transformer activations per layer (Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models", arXiv:2205.05198, eqs. 1-2; 2-byte activations, 1-byte dropout masks):
    s b h (34 + 5 a s / h)                 no tensor parallelism
    s b h (10 + 24/t + 5 a s / (h t))      tensor parallel t
    s b h (34 + 5 a s / h) / t             tensor + sequence parallel
    2 s b h                                full recomputation (the layer input only)
Their 2-byte terms are rescaled by e/2 for e-byte activations (fp32: e = 4), masks dropped
without dropout. Over L layers with 1F1B pipelining the first stage holds L layers' worth
(independent of p, eq. 4); the output head adds 4 s b h / t (1 + v / h) (sec. 4.4).

For a needle ``Module`` activations are *measured* (``graph_bytes`` of one forward pass):
needle keeps every op output, so Megatron's constants do not apply; backward adds the adjoints
alive at once (``backward_liveness_peak``).
"""
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..autograd import Tensor, Value, find_topo_sort

__all__ = ["TransformerConfig", "MemoryEstimate", "estimate_transformer", "estimate_module",
           "optimizer_state_bytes", "graph_bytes", "transformer_num_params",
           "layer_activation_bytes"]

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adafactor")
PRECISIONS = ("fp32", "mixed")


@dataclass
class TransformerConfig:
    """A GPT-style decoder: layers, hidden, heads, seq, vocab, (micro-)batch, ffn multiple."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    batch: int
    ffn_mult: int = 4


@dataclass
class MemoryEstimate:
    """Bytes per term with the formula that produced it; ``total`` sums them."""

    terms: List[Tuple[str, float, str]] = field(default_factory=list)
    num_params: int = 0
    notes: List[str] = field(default_factory=list)

    def add(self, name: str, nbytes: float, formula: str) -> None:
        """Append a term."""
        self.terms.append((name, float(nbytes), formula))

    def __getitem__(self, name: str) -> float:
        for n, b, _ in self.terms:
            if n == name:
                return b
        raise KeyError(name)

    @property
    def model_states(self) -> float:
        """Parameters + gradients + optimizer state."""
        return sum(b for n, b, _ in self.terms if n in ("parameters", "gradients",
                                                         "optimizer_state"))

    @property
    def total(self) -> float:
        """Every term summed (the predicted peak)."""
        return sum(b for _, b, _ in self.terms)

    def report(self) -> str:
        """A table: term, bytes, GiB, formula."""
        lines = [f"parameters (Psi) = {self.num_params:,}"]
        for name, nbytes, formula in self.terms + [("total", self.total, "sum of the above")]:
            lines.append(f"{name:<18}{nbytes:>18,.0f} B {nbytes / 2 ** 30:>10.3f} GiB   {formula}")
        lines.extend("note: " + n for n in self.notes)
        return "\n".join(lines)


def _check_choice(value: str, allowed: Sequence[str], what: str) -> str:
    v = value.lower()
    if v not in allowed:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(allowed)}")
    return v


def _check_parallel(zero_stage: int, dp: int, tp: int, pp: int) -> None:
    for name, v in (("dp", dp), ("tp", tp), ("pp", pp)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} degree must be a positive int, got {v!r}")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {zero_stage!r}")


def transformer_num_params(cfg: TransformerConfig) -> int:
    """12 L h^2 + 13 L h + V h + s h (GPT-2 block: qkv, proj, 2-layer MLP, 2 LayerNorms)."""
    L, h, f = cfg.layers, cfg.hidden, cfg.ffn_mult
    per_layer = (4 * h * h + 4 * h) + (2 * f * h * h + f * h + h) + 4 * h
    return L * per_layer + cfg.vocab * h + cfg.seq * h


def _factored_bytes(shape: Tuple[int, ...], itemsize: int = 4) -> int:
    """Adafactor second-moment bytes: rows + cols for >= 2-D, the full tensor otherwise."""
    if len(shape) < 2:
        return int(np.prod(shape)) * itemsize
    lead = int(np.prod(shape[:-2]))
    return lead * (shape[-2] + shape[-1]) * itemsize


def optimizer_state_bytes(shapes: Sequence[Tuple[int, ...]], optimizer: str,
                          precision: str = "fp32",
                          counts: Optional[Sequence[int]] = None) -> Tuple[float, str]:
    """(bytes, formula) of optimizer state for ``counts[i]`` copies of each shape (L identical
    layers are one layer's shapes counted L times)."""
    opt = _check_choice(optimizer, OPTIMIZERS, "optimizer")
    counts = [1] * len(shapes) if counts is None else list(counts)
    psi = sum(n * math.prod(s) for s, n in zip(shapes, counts))
    master = 4 * psi if precision == "mixed" else 0
    if opt == "sgd":
        state, formula = 0, "0 (plain SGD)"
    elif opt == "momentum":
        state, formula = 4 * psi, "4 Psi (momentum)"
    elif opt in ("adam", "adamw"):
        state, formula = 8 * psi, "8 Psi (m, v)"
    else:
        state = sum(n * _factored_bytes(tuple(s)) for s, n in zip(shapes, counts))
        formula = "4 sum(rows + cols) matrices + 4 Psi vectors (factored v, Shazeer & Stern)"
    if master:
        formula = "4 Psi (fp32 master) + " + formula
    return master + state, formula


def _model_states(est: MemoryEstimate, shapes: Sequence[Tuple[int, ...]], psi_local: float,
                  optimizer: str, precision: str, zero_stage: int, dp: int, shard: float,
                  p_bytes: Optional[float] = None,
                  counts: Optional[Sequence[int]] = None) -> None:
    P = (2 if precision == "mixed" else 4) if p_bytes is None else p_bytes
    G = P
    counts = [1] * len(shapes) if counts is None else list(counts)
    total_k, k_formula = optimizer_state_bytes(shapes, optimizer, precision, counts)
    psi = max(sum(n * math.prod(s) for s, n in zip(shapes, counts)), 1)
    K = total_k / psi
    par = "Psi/(t p)" if shard != 1 else "Psi"
    z = zero_stage
    est.add("parameters", P * psi_local / (dp if z == 3 else 1),
            f"{P:g} {par}" + (" / Nd (ZeRO-3)" if z == 3 else ""))
    est.add("gradients", G * psi_local / (dp if z >= 2 else 1),
            f"{G:g} {par}" + (" / Nd (ZeRO-2/3)" if z >= 2 else ""))
    est.add("optimizer_state", K * psi_local / (dp if z >= 1 else 1),
            f"K {par}, K = {K:.3g}: {k_formula}" + (" / Nd (ZeRO-1+)" if z >= 1 else ""))


def _check_transformer(cfg: TransformerConfig, tp: int, pp: int) -> None:
    """Positive sizes, heads dividing hidden, tp dividing heads and the FFN, pp the layers."""
    L, h, a = cfg.layers, cfg.hidden, cfg.heads
    for name, v in (("layers", L), ("hidden", h), ("heads", a), ("seq", cfg.seq),
                    ("vocab", cfg.vocab), ("batch", cfg.batch), ("ffn_mult", cfg.ffn_mult)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if h % a:
        raise ValueError(f"hidden ({h}) is not divisible by heads ({a})")
    if a % tp:
        raise ValueError(f"tensor-parallel degree {tp} does not divide heads ({a})")
    if (cfg.ffn_mult * h) % tp:
        raise ValueError(f"tensor-parallel degree {tp} does not divide the FFN width "
                         f"({cfg.ffn_mult * h})")
    if L % pp:
        raise ValueError(f"pipeline-parallel degree {pp} does not divide layers ({L})")


def layer_activation_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool = False,
                           recompute: str = "none", e: int = 2, dropout: bool = True) -> float:
    """One layer's activations in bytes (Korthikanti et al., arXiv:2205.05198, Table 2) with
    ``e``-byte activations: ``recompute`` "none", "selective" (the attention core is rebuilt)
    or "full" (the layer input only); ``sp``: sequence parallel over the t tensor ranks."""
    if recompute == "full":
        return e * s * b * h
    core = e / 2 * 4 * a * s * s * b / t + (a * s * s * b / t if dropout else 0)  # 5as/h term
    mask = 2 * s * b * h if dropout else 0
    if sp:
        rest = (e / 2 * 32 * s * b * h + mask) / t
    else:
        rest = e / 2 * (8 + 24 / t) * s * b * h + mask
    return rest + (0 if recompute == "selective" else core)


def _layer_activations(cfg: TransformerConfig, t: int, e: int, dropout: bool,
                       checkpointing: bool, sequence_parallel: bool) -> Tuple[float, float, str]:
    """(one layer's activations, what each of the L layers keeps, the formula) in bytes."""
    shape = (cfg.seq, cfg.batch, cfg.hidden, cfg.heads, t)
    layer = layer_activation_bytes(*shape, e=e, dropout=dropout)  # tensor parallelism alone
    per_layer = layer_activation_bytes(*shape, sequence_parallel,
                                       "full" if checkpointing else "none", e, dropout)
    if checkpointing:
        formula = f"L * {e} s b h (full recompute: layer inputs only)"
    elif sequence_parallel:
        formula = "L * s b h (34 + 5 a s / h) / t (sequence parallel)"
    else:
        formula = "L * s b h (10 + 24/t + 5 a s / (h t))" if t > 1 else \
            "L * s b h (34 + 5 a s / h)"
    if e != 2 or not dropout:
        formula += f"  [{e}-byte activations" + (", no dropout masks]" if not dropout else "]")
    return layer, per_layer, formula


def estimate_transformer(cfg: TransformerConfig, *, precision: str = "fp32",
                         optimizer: str = "adam", checkpointing: bool = False,
                         zero_stage: int = 0, dp: int = 1, tp: int = 1, pp: int = 1,
                         sequence_parallel: bool = False, dropout: bool = True
                         ) -> MemoryEstimate:
    """Per-device training memory of a GPT-style transformer from the published formulas."""
    precision = _check_choice(precision, PRECISIONS, "precision")
    _check_parallel(zero_stage, dp, tp, pp)
    _check_transformer(cfg, tp, pp)
    L, h, s, V, b = cfg.layers, cfg.hidden, cfg.seq, cfg.vocab, cfg.batch
    psi = transformer_num_params(cfg)
    est = MemoryEstimate(num_params=psi)
    f = cfg.ffn_mult
    layer_shapes = [(h, 3 * h), (3 * h,), (h, h), (h,), (h, f * h), (f * h,), (f * h, h), (h,),
                    (h,), (h,), (h,), (h,)]
    shapes = layer_shapes + [(V, h), (s, h)]  # one layer's shapes, counted L times
    _model_states(est, shapes, psi / (tp * pp), optimizer, precision, zero_stage, dp,
                  shard=tp * pp, counts=[L] * len(layer_shapes) + [1, 1])
    e = 2 if precision == "mixed" else 4
    layer, per_layer, formula = _layer_activations(cfg, tp, e, dropout, checkpointing,
                                                   sequence_parallel)
    est.add("activations", L * per_layer, formula)
    if checkpointing:
        est.add("recompute_layer", layer, "one layer's activations while it is recomputed")
    est.add("output_head", e / 2 * 4 * s * b * h / tp + 4 * s * b * V / tp,
            "4 s b h / t (1 + v / h)  [fp32 logits]")
    if precision == "mixed":
        est.notes.append("mixed = fp16/bf16 weights and grads + fp32 master (ZeRO's 2+2+K); "
                         "needle.amp.autocast keeps fp32 params and grads instead (4+4+K)")
    return est


def graph_bytes(output: Tensor, exclude: Sequence[Tensor] = ()) -> int:
    """Bytes of the distinct buffers held by ``output``'s graph, ``exclude``'s aside."""
    skip = {id(t.realize_cached_data()._handle) for t in exclude}
    seen: Dict[int, int] = {}
    for node in find_topo_sort([output]):
        data = node.cached_data
        if data is not None and hasattr(data, "_handle") and id(data._handle) not in skip:
            buf = data._handle
            seen[id(buf)] = buf.array.nbytes if hasattr(buf, "array") else buf.nbytes
    return sum(seen.values())


def backward_liveness_peak(output: Tensor) -> int:
    """Peak bytes of adjoints alive at once when backward walks ``output``'s graph.

    Replays ``compute_gradient_of_variables`` on sizes only: partial adjoints live from their
    producer until their node is processed; leaf gradients are the ``gradients`` term. Two
    input-sized temporaries per step stand for the masks/products a gradient builds.
    """
    topo = find_topo_sort([output])
    size = {id(n): _nbytes(n) for n in topo}
    pending: Dict[int, List[int]] = {id(output): [size[id(output)]]}
    live = peak = size[id(output)]
    for node in reversed(topo):
        parts = pending.pop(id(node), None)
        if parts is None:
            continue
        if len(parts) > 1:  # the sum is a new buffer, then the parts go
            live += size[id(node)]
            peak = max(peak, live)
            live -= sum(parts)
            grad = size[id(node)]
        else:
            grad = parts[0]
        if node.op is not None:
            for inp in node.inputs:
                if inp.requires_grad:
                    part = size[id(inp)]
                    live += part
                    pending.setdefault(id(inp), []).append(part)
                    peak = max(peak, live + 2 * part)
        live -= grad
    return peak


def _nbytes(node: Value) -> int:
    data = node.cached_data
    if data is None or not hasattr(data, "shape"):  # a TensorTuple's tuple: its parts count
        return 0
    return int(np.prod(data.shape)) * _itemsize(data.dtype)


def estimate_module(model: Any, sample_inputs: Sequence[Any], *,
                    loss_fn: Optional[Callable[..., Tensor]] = None, optimizer: str = "adam",
                    precision: str = "fp32", zero_stage: int = 0, dp: int = 1,
                    tp: int = 1, pp: int = 1) -> MemoryEstimate:
    """Estimate a needle Module: exact parameter/optimizer terms, graph-measured activations."""
    precision = _check_choice(precision, PRECISIONS, "precision")
    _check_parallel(zero_stage, dp, tp, pp)
    params = [p for p in model.parameters() if p.requires_grad]
    shapes = [tuple(p.shape) for p in params]
    psi = sum(int(np.prod(s)) for s in shapes)
    itemsize = _itemsize(params[0].dtype) if params else 2
    est = MemoryEstimate(num_params=psi)
    frozen = [p for p in model.parameters() if not p.requires_grad]
    if frozen:
        fb = sum(int(np.prod(p.shape)) * _itemsize(p.dtype) for p in frozen)
        est.add("frozen_params", fb, "bytes of frozen (requires_grad=False) weights")
    p_bytes = itemsize if precision == "fp32" else 2
    _model_states(est, shapes, psi / (tp * pp), optimizer, precision, zero_stage, dp,
                  shard=tp * pp, p_bytes=p_bytes)
    out = model(*sample_inputs)
    if loss_fn is not None:
        out = loss_fn(out)
    act = graph_bytes(out, exclude=list(model.parameters()) +
                      [x for x in sample_inputs if isinstance(x, Tensor)])
    transient = backward_liveness_peak(out)
    del out
    est.add("activations", act / (tp * pp),
            "bytes of the distinct buffers held by the forward graph (measured on the sample)")
    est.add("backward_transient", transient / (tp * pp),
            "peak of live adjoints replaying backward's order on sizes (+2 temporaries)")
    return est


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize

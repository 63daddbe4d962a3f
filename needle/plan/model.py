"""What is being trained: a transformer config, a preset, a needle Module, or a parameter count.

A ``ModelSpec`` is a GPT-style decoder (layers L, hidden h, heads a, sequence s, vocabulary V,
FFN width f h) or only a parameter count Psi (``--params 7.5e9``), which answers model-state
questions but not activation or FLOP ones. Training FLOPs per iteration of B sequences follow
Narayanan et al. (SC'21, arXiv:2104.04473, eq. 3; Appendix):

    F = 72 B s L h^2 (1 + s / (6 h) + V / (12 L h))           (forward + backward)
    F = 96 B s L h^2 (1 + s / (6 h) + V / (16 L h))           (+ a full recomputed forward)

and selective recomputation (Korthikanti et al., arXiv:2205.05198, sec. 5) re-runs only the
attention core, 4 B s^2 h per layer (QK^T and softmax-times-V).
"""
import math
from dataclasses import dataclass, replace
from typing import Any, Dict, Optional

import numpy as np

from ..memory.estimator import TransformerConfig, transformer_num_params

__all__ = ["ModelSpec", "PRESETS", "preset", "from_module", "training_flops"]


@dataclass(frozen=True)
class ModelSpec:
    """A decoder's shape, or (every shape field 0) only its parameter count."""

    layers: int = 0
    hidden: int = 0
    heads: int = 0
    seq: int = 0
    vocab: int = 0
    ffn_mult: int = 4
    params: float = 0.0  # Psi; computed from the shape when the shape is given
    name: str = "custom"

    @property
    def is_transformer(self) -> bool:
        """True when the shape is known (activations and FLOPs can be predicted)."""
        return any(getattr(self, k) for k in ("layers", "hidden", "heads", "seq", "vocab"))

    @property
    def num_params(self) -> float:
        """Psi: the given count, else 12 L h^2 + 13 L h + V h + s h."""
        if self.params:
            return float(self.params)
        return float(transformer_num_params(self.config(1)))

    def config(self, microbatch: int) -> TransformerConfig:
        """The estimator's config for one microbatch."""
        return TransformerConfig(self.layers, self.hidden, self.heads, self.seq, self.vocab,
                                 microbatch, self.ffn_mult)

    def check(self) -> "ModelSpec":
        """Raise ValueError naming the field and the rule when the shape is impossible."""
        if not self.is_transformer:
            if not 0 < self.params < math.inf:
                raise ValueError(f"params must be > 0 and finite (a parameter count), got "
                                 f"{self.params!r}")
            return self
        for name in ("layers", "hidden", "heads", "seq", "vocab", "ffn_mult"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.hidden % self.heads:
            raise ValueError(f"heads must divide hidden: hidden={self.hidden} is not a "
                             f"multiple of heads={self.heads}")
        return self


def _gpt(name: str, L: int, h: int, a: int, s: int = 1024, V: int = 50257) -> ModelSpec:
    return ModelSpec(L, h, a, s, V, name=name)


# GPT-2 (Radford et al. 2019), GPT-3 (Brown et al. 2020, Table 2.1), LLaMA (Touvron et al. 2023,
# Table 2; its SwiGLU FFN of width 8h/3 x 3 matrices is counted as the 4h GPT FFN's 2 matrices
# of the same parameter count would be: 3 * 8/3 = 8 = 2 * 4).
PRESETS: Dict[str, ModelSpec] = {p.name: p for p in (
    _gpt("gpt2-small", 12, 768, 12), _gpt("gpt2-medium", 24, 1024, 16),
    _gpt("gpt2-large", 36, 1280, 20), _gpt("gpt2-xl", 48, 1600, 25),
    _gpt("gpt1", 12, 768, 12, 512, 40512),
    _gpt("gpt3-175b", 96, 12288, 96, 2048, 50257),
    _gpt("llama-7b", 32, 4096, 32, 2048, 32000), _gpt("llama-13b", 40, 5120, 40, 2048, 32000),
    _gpt("llama-70b", 80, 8192, 64, 4096, 32000),
    _gpt("gpt-1t", 128, 25600, 160, 2048, 51200),
)}


def preset(name: str, **overrides: Any) -> ModelSpec:
    """A named model, optionally with some fields replaced (``seq=2048``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides).check()


def from_module(module: Any, name: Optional[str] = None) -> ModelSpec:
    """A parameter-count spec from a needle Module, counted by walking its parameters."""
    seen = {id(p): int(np.prod(p.shape)) for p in module.parameters() if p.requires_grad}
    return ModelSpec(params=float(sum(seen.values())),
                     name=name or type(module).__name__).check()


def training_flops(spec: ModelSpec, batch: int, recompute: str = "none") -> float:
    """FLOPs of one training iteration on ``batch`` sequences (Narayanan et al., eq. 3)."""
    if not spec.is_transformer:
        raise ValueError("FLOPs need the model's shape (--layers/--hidden/...), not only --params")
    B, s, L, h, V = batch, spec.seq, spec.layers, spec.hidden, spec.vocab
    f = spec.ffn_mult / 4.0  # the 72 counts a 4h FFN's 16 B s h^2 x 3 (fwd + 2 bwd) of the 24
    base = B * s * L * h * h
    dense = 72 * base * ((8 + 16 * f) / 24) + 12 * B * s * s * h * L + 6 * B * s * h * V
    if recompute == "full":
        dense += 24 * base * ((8 + 16 * f) / 24) + 4 * B * s * s * h * L + 0 * V
    elif recompute == "selective":
        dense += 4 * B * s * s * h * L
    return float(dense)

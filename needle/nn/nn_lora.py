"""LoRA and QLoRA: train a low-rank update beside a frozen (optionally 4-bit) weight.

LoRA (Hu et al., arXiv:2106.09685, eq. 3): h = x W0 + (alpha / r) x A B with W0 frozen, A (in, r)
random (Kaiming) and B (r, out) zero, so training starts from the pretrained function and only
r (in + out) numbers per layer get gradients and optimizer state. ``merge`` folds the update
into W0 for inference; ``unmerge`` takes it out again. (needle's Linear weight is (in, out), so
the update is A @ B rather than the paper's B A.)

QLoRA (Dettmers et al., arXiv:2305.14314, sec. 3): W0 is stored in the 4-bit NF4 format
(``needle.quant.nf4``) and dequantized on the fly inside the matmul op's forward and again
inside its gradient, so no full-precision copy of W0 outlives an op.
"""
import math
from typing import Any, List, Optional, Sequence

from .. import init, numbers
from ..autograd import NDArray, Tensor
from ..backend_ndarray import BackendDevice
from ..quant.nf4 import NF4MatMul, NF4Tensor, nf4_codebook, quantize_nf4
from .nn_basic import Linear
from .nn_module import Module, Parameter

# the NF4 names stay importable from needle.nn, where QLoRA users find them
__all__ = ["LoRALinear", "apply_lora", "lora_parameters", "nf4_codebook", "NF4Tensor",
           "quantize_nf4", "QLoRALinear", "apply_qlora"]


# ---------------------------------------------------------------------------------- LoRA
class LoRALinear(Module):
    """A frozen ``Linear`` plus a trainable rank-``r`` update scaled by alpha / r."""

    def __init__(self, base: Linear, r: int = 8, alpha: float = 16.0,
                 device: Optional[BackendDevice] = None) -> None:
        super().__init__()
        if not isinstance(base, Linear):
            raise TypeError(f"LoRALinear wraps an nn.Linear, got {type(base).__name__}")
        if not isinstance(r, int) or r < 1 or r > min(base.in_features, base.out_features):
            top = min(base.in_features, base.out_features)
            raise ValueError(f"LoRA rank r must be in [1, {top}] for Linear("
                             f"{base.in_features}, {base.out_features}), got {r!r}")
        alpha = numbers.real_arg(alpha, "LoRALinear: alpha")  # nan scaled every update to nan
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        for p in base.parameters():
            p.requires_grad = False
        device = device if device is not None else base.weight.device
        dtype = base.weight.dtype
        self.lora_A = Parameter(init.kaiming_uniform(self.in_features, r, device=device,
                                                     dtype=dtype))
        self.lora_B = Parameter(init.zeros(r, self.out_features, device=device, dtype=dtype))
        self.merged = False

    def delta(self) -> NDArray:
        """(alpha / r) A @ B as an array of the base weight's shape."""
        a, b = self.lora_A.realize_cached_data(), self.lora_B.realize_cached_data()
        return (a @ b) * self.scaling

    def forward(self, x: Tensor) -> Tensor:
        out = self.base(x)
        if self.merged:
            return out
        return out + ((x @ self.lora_A) @ self.lora_B) * self.scaling

    def merge(self) -> None:
        """W0 += (alpha / r) A B (inference without the extra matmuls)."""
        if not self.merged:
            w = self.base.weight
            w.cached_data = w.realize_cached_data() + self.delta()
            self.merged = True

    def unmerge(self) -> None:
        """W0 -= (alpha / r) A B (back to the trainable form)."""
        if self.merged:
            w = self.base.weight
            w.cached_data = w.realize_cached_data() - self.delta()
            self.merged = False

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, r={self.r}, alpha={self.alpha}"


def _matches(name: str, targets: Optional[Sequence[str]]) -> bool:
    return targets is None or any(t == name or name.endswith("." + t) for t in targets)


def _replace_linears(model: Module, targets: Optional[Sequence[str]], make: Any) -> List[str]:
    """Swap matching Linear attributes (and list entries) of every sub-module in place."""
    replaced = []
    for prefix, module in list(model.named_modules()):
        for attr, value in list(module.__dict__.items()):
            items = value if isinstance(value, list) else [value]
            for i, item in enumerate(items):
                name = ".".join(x for x in (prefix, attr, str(i) if isinstance(value, list)
                                            else "") if x)
                if type(item) is Linear and _matches(name, targets):
                    new = make(item)
                    if isinstance(value, list):
                        value[i] = new
                    else:
                        setattr(module, attr, new)
                    replaced.append(name)
    return replaced


def _wrap_linears(what: str, model: Module, targets: Optional[Sequence[str]], make: Any
                  ) -> Module:
    """Replace the matching Linears by ``make(linear)``, then freeze all but the LoRA factors."""
    if not _replace_linears(model, targets, make):
        raise ValueError(f"{what}: no nn.Linear matched target_modules={targets}")
    lora = {id(p) for p in lora_parameters(model)}
    for p in model.parameters():
        p.requires_grad = id(p) in lora
    return model


def apply_lora(model: Module, r: int = 8, alpha: float = 16.0,
               target_modules: Optional[Sequence[str]] = None) -> Module:
    """Wrap the Linear layers named in ``target_modules`` (all when None) and freeze the rest."""
    return _wrap_linears("apply_lora", model, target_modules, lambda lin: LoRALinear(lin, r, alpha))


def lora_parameters(model: Module) -> List[Parameter]:
    """The trainable LoRA factors A and B of every LoRA layer."""
    return [p for _, m in model.named_modules() if isinstance(m, (LoRALinear, QLoRALinear))
            for p in (m.lora_A, m.lora_B)]


class QLoRALinear(Module):
    """A Linear whose frozen weight is NF4 (dequantized on the fly) plus a LoRA update."""

    def __init__(self, base: Linear, r: int = 8, alpha: float = 16.0, block_size: int = 64,
                 double_quant: bool = True) -> None:
        super().__init__()
        if not isinstance(base, Linear):
            raise TypeError(f"QLoRALinear wraps an nn.Linear, got {type(base).__name__}")
        self.in_features, self.out_features = base.in_features, base.out_features
        if not isinstance(r, int) or not 1 <= r <= min(self.in_features, self.out_features):
            top = min(self.in_features, self.out_features)
            raise ValueError(f"LoRA rank r must be in [1, {top}], got {r!r}")
        self.qweight = quantize_nf4(base.weight, block_size, double_quant)
        self.bias = base.bias
        if self.bias is not None:
            self.bias.requires_grad = False
        device, dtype = base.weight.device, base.weight.dtype
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        self.lora_A = Parameter(init.kaiming_uniform(self.in_features, r, device=device,
                                                     dtype=dtype))
        self.lora_B = Parameter(init.zeros(r, self.out_features, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape((math.prod(lead), self.in_features)) if len(lead) != 1 else x
        out = NF4MatMul(self.qweight)(x2)
        if self.bias is not None:
            out = out + self.bias.broadcast_to(out.shape)
        out = out + ((x2 @ self.lora_A) @ self.lora_B) * self.scaling
        return out.reshape(tuple(lead) + (self.out_features,)) if len(lead) != 1 else out

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, r={self.r}, nf4 "
                f"{self.qweight.bytes_per_param():.3f} B/param")


def apply_qlora(model: Module, r: int = 8, alpha: float = 16.0,
                target_modules: Optional[Sequence[str]] = None, block_size: int = 64,
                double_quant: bool = True) -> Module:
    """Replace matching Linear layers by QLoRALinear (NF4 base + LoRA) and freeze the rest."""
    return _wrap_linears("apply_qlora", model, target_modules,
                         lambda lin: QLoRALinear(lin, r, alpha, block_size, double_quant))

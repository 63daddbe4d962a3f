"""LoRA and QLoRA: train a low-rank update beside a frozen (optionally 4-bit) weight.

LoRA (Hu et al., arXiv:2106.09685, eq. 3): h = x W0 + (alpha / r) x A B with W0 frozen, A (in, r)
random (Kaiming) and B (r, out) zero, so training starts from the pretrained function and only
r (in + out) numbers per layer get gradients and optimizer state. ``merge`` folds the update
into W0 for inference; ``unmerge`` takes it out again. (needle's Linear weight is (in, out), so
the update is A @ B rather than the paper's B A.)

QLoRA (Dettmers et al., arXiv:2305.14314, sec. 3): W0 is stored as 4-bit NormalFloat codes in
blocks of 64 with one absmax scale per block; double quantization stores those scales as 8-bit
codes (blocks of 256, minus their mean) plus one float32 scale per 256 blocks. The weight is
dequantized on the fly inside the matmul op's forward and again inside its gradient, so no
full-precision copy of W0 outlives an op. The paper's scale codes are FP8; here they are
linear int8 (absmax), the simpler scheme of Dettmers et al. 2022, arXiv:2110.02861.
"""
import math
from statistics import NormalDist
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from .. import init
from ..autograd import NDArray, Tensor, TensorOp
from ..backend_ndarray import BackendDevice
from .nn_basic import Linear
from .nn_module import Module, Parameter

__all__ = ["LoRALinear", "apply_lora", "merge_lora", "unmerge_lora", "lora_parameters",
           "nf4_codebook", "NF4Tensor", "quantize_nf4", "QLoRALinear", "apply_qlora"]


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
    return targets is None or any(t == name or name.endswith("." + t) or
                                  name.split(".")[-1] == t for t in targets)


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


def _freeze_all_but_lora(model: Module) -> None:
    lora = {id(p) for m in model.modules() if isinstance(m, (LoRALinear, QLoRALinear))
            for p in (m.lora_A, m.lora_B)}
    for p in model.parameters():
        p.requires_grad = id(p) in lora


def apply_lora(model: Module, r: int = 8, alpha: float = 16.0,
               target_modules: Optional[Sequence[str]] = None) -> Module:
    """Wrap the Linear layers named in ``target_modules`` (all when None) and freeze the rest."""
    replaced = _replace_linears(model, target_modules, lambda lin: LoRALinear(lin, r, alpha))
    if not replaced:
        raise ValueError(f"apply_lora: no nn.Linear matched target_modules={target_modules}")
    _freeze_all_but_lora(model)
    return model


def lora_parameters(model: Module) -> List[Parameter]:
    """The trainable LoRA factors A and B of every LoRA layer."""
    return [p for m in model.modules() if isinstance(m, (LoRALinear, QLoRALinear))
            for p in (m.lora_A, m.lora_B)]


def merge_lora(model: Module) -> None:
    """Merge every LoRALinear of ``model``."""
    for m in model.modules():
        if isinstance(m, LoRALinear):
            m.merge()


def unmerge_lora(model: Module) -> None:
    """Unmerge every LoRALinear of ``model``."""
    for m in model.modules():
        if isinstance(m, LoRALinear):
            m.unmerge()


# ---------------------------------------------------------------------------------- NF4
def nf4_codebook() -> np.ndarray:
    """The 16 NF4 levels: normal quantiles, 8 positive and 7 negative, exact 0, scaled to [-1, 1].

    Dettmers et al. 2023, eq. (4) with offset 0.9677 as in their reference implementation.
    """
    offset = 0.9677083
    ppf = NormalDist().inv_cdf
    pos = [ppf(p) for p in np.linspace(offset, 0.5, 9)[:-1]]
    neg = [-ppf(p) for p in np.linspace(offset, 0.5, 8)[:-1]]
    values = np.array(sorted(pos + [0.0] + neg), dtype=np.float64)
    return (values / np.abs(values).max()).astype(np.float32)


_NF4 = nf4_codebook()
_MIDPOINTS = (_NF4[1:] + _NF4[:-1]) / 2


def _absmax_int8(x: np.ndarray, block: int) -> Tuple[np.ndarray, np.ndarray]:
    pad = (-x.size) % block
    xb = np.concatenate([x, np.zeros(pad, x.dtype)]).reshape(-1, block)
    scale = np.abs(xb).max(axis=1)
    scale[scale == 0] = 1.0
    codes = np.round(xb / scale[:, None] * 127).astype(np.int8)
    return codes.reshape(-1)[: x.size], scale.astype(np.float32)


class NF4Tensor:
    """A weight stored as packed 4-bit NF4 codes with per-block absmax scales."""

    def __init__(self, weight: np.ndarray, block_size: int = 64, double_quant: bool = True,
                 scale_block: int = 256, device: Optional[BackendDevice] = None):
        w = np.asarray(weight, dtype=np.float32)
        if w.size == 0:
            raise ValueError("cannot quantize an empty weight")
        self.shape, self.block_size, self.double_quant = w.shape, block_size, double_quant
        flat = w.reshape(-1)
        pad = (-flat.size) % block_size
        blocks = np.concatenate([flat, np.zeros(pad, np.float32)]).reshape(-1, block_size)
        absmax = np.abs(blocks).max(axis=1)
        absmax[absmax == 0] = 1.0
        codes = np.searchsorted(_MIDPOINTS, blocks / absmax[:, None]).astype(np.uint8)
        codes = codes.reshape(-1)
        if codes.size % 2:
            codes = np.concatenate([codes, np.zeros(1, np.uint8)])
        packed = (codes[0::2] << 4) | codes[1::2]                   # two codes per byte
        from ..backend_ndarray import array as nd_array
        self.packed = nd_array(packed, dtype="uint8", device=device)
        if double_quant:
            self.scale_mean = float(absmax.mean())
            q, s2 = _absmax_int8(absmax - self.scale_mean, scale_block)
            self.scale_codes = nd_array(q, dtype="int8", device=device)
            self.scale_scales = nd_array(s2, dtype="float32", device=device)
            self.scale_block = scale_block
        else:
            self.scales = nd_array(absmax.astype(np.float32), dtype="float32", device=device)
        self.num_blocks = blocks.shape[0]

    def block_scales(self) -> np.ndarray:
        """Per-block absmax scales (dequantized when double-quantized)."""
        if not self.double_quant:
            return self.scales.numpy()
        q = self.scale_codes.numpy().astype(np.float32)
        s2 = np.repeat(self.scale_scales.numpy(), self.scale_block)[: q.size]
        return q / 127 * s2 + self.scale_mean

    def dequantize(self) -> np.ndarray:
        """The float32 weight back from the codes."""
        p = self.packed.numpy()
        codes = np.stack([p >> 4, p & 15], axis=1).reshape(-1)
        n_padded = self.num_blocks * self.block_size
        vals = _NF4[codes[:n_padded]].reshape(self.num_blocks, self.block_size)
        w = (vals * self.block_scales()[:, None]).reshape(-1)[: int(np.prod(self.shape))]
        return w.reshape(self.shape).astype(np.float32)

    @property
    def nbytes(self) -> int:
        """Bytes of codes and scales."""
        parts = [self.packed] + ([self.scale_codes, self.scale_scales] if self.double_quant
                                 else [self.scales])
        return sum(a.nbytes for a in parts) + (4 if self.double_quant else 0)

    def bytes_per_param(self) -> float:
        """Storage bytes per weight element (0.5 + scale overhead)."""
        return self.nbytes / int(np.prod(self.shape))


def quantize_nf4(weight: Any, block_size: int = 64, double_quant: bool = True) -> NF4Tensor:
    """NF4-quantize a Tensor / NDArray / numpy weight."""
    device = None
    if isinstance(weight, Tensor):
        device, weight = weight.device, weight.numpy()
    elif isinstance(weight, NDArray):
        device, weight = weight.device, weight.numpy()
    return NF4Tensor(weight, block_size, double_quant, device=device)


class NF4MatMul(TensorOp):
    """x @ dequant(W) with W held as NF4; the gradient w.r.t. x is NF4MatMulT."""

    def __init__(self, qweight: NF4Tensor):
        self.q = qweight

    def _weight(self, like: NDArray) -> NDArray:
        return NDArray(self.q.dequantize(), device=like.device, dtype=like.dtype)

    def compute(self, x: NDArray) -> NDArray:
        return x @ self._weight(x)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return NF4MatMulT(self.q)(out_grad)


class NF4MatMulT(NF4MatMul):
    """g @ dequant(W)^T (the input gradient of NF4MatMul)."""

    def compute(self, g: NDArray) -> NDArray:
        return g @ self._weight(g).permute((1, 0))

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return NF4MatMul(self.q)(out_grad)


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
    replaced = _replace_linears(model, target_modules,
                                lambda lin: QLoRALinear(lin, r, alpha, block_size, double_quant))
    if not replaced:
        raise ValueError(f"apply_qlora: no nn.Linear matched target_modules={target_modules}")
    _freeze_all_but_lora(model)
    return model

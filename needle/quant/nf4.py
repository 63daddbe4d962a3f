"""NF4: QLoRA's 4-bit NormalFloat weights (arXiv:2305.14314, sec. 3), blocks of 64 with absmax
scales double-quantized to int8; ``NF4MatMul`` dequantizes inside forward and gradient only."""
from statistics import NormalDist
from typing import Any, Optional, Tuple

import numpy as np

from .. import numbers
from ..autograd import NDArray, Tensor, TensorOp
from ..backend_ndarray import BackendDevice
from ..backend_ndarray import array as nd_array

__all__ = ["nf4_codebook", "NF4Tensor", "quantize_nf4", "NF4MatMul", "NF4MatMulT"]


def nf4_codebook() -> np.ndarray:
    """The 16 NF4 levels: normal quantiles scaled to [-1, 1] with an exact 0 (Dettmers et al. 2023,
    eq. 4, offset 0.9677 as their reference implementation)."""
    offset = 0.9677083
    ppf = NormalDist().inv_cdf
    pos = [ppf(p) for p in np.linspace(offset, 0.5, 9)[:-1]]
    neg = [-ppf(p) for p in np.linspace(offset, 0.5, 8)[:-1]]
    values = np.array(sorted(pos + [0.0] + neg), dtype=np.float64)
    return (values / np.abs(values).max()).astype(np.float32)


_NF4 = nf4_codebook()
_MIDPOINTS = (_NF4[1:] + _NF4[:-1]) / 2


def _blocks(x: np.ndarray, block: int) -> Tuple[np.ndarray, np.ndarray]:
    """``x`` zero-padded into rows of ``block``, and each row's absmax (1 for an all-zero row)."""
    xb = np.concatenate([x, np.zeros((-x.size) % block, x.dtype)]).reshape(-1, block)
    absmax = np.abs(xb).max(axis=1)
    absmax[absmax == 0] = 1.0
    return xb, absmax


def _absmax_int8(x: np.ndarray, block: int) -> Tuple[np.ndarray, np.ndarray]:
    xb, scale = _blocks(x, block)
    codes = np.round(xb / scale[:, None] * 127).astype(np.int8)
    return codes.reshape(-1)[: x.size], scale.astype(np.float32)


class NF4Tensor:
    """A weight stored as packed 4-bit NF4 codes with per-block absmax scales."""

    def __init__(self, weight: np.ndarray, block_size: int = 64, double_quant: bool = True,
                 scale_block: int = 256, device: Optional[BackendDevice] = None):
        w = np.asarray(weight, dtype=np.float32)
        if w.size == 0:
            raise ValueError("cannot quantize an empty weight")
        # 0 divided by zero, -64 and 32.5 ended in NumPy's reshape
        block_size = numbers.count_arg(block_size, "NF4: block_size", lo=1)
        scale_block = numbers.count_arg(scale_block, "NF4: scale_block", lo=1)
        if not np.isfinite(w).all():  # nan or inf became arbitrary codes (a cast warning only)
            raise ValueError(f"cannot quantize a weight holding nan or inf ({w.shape})")
        self.shape, self.block_size, self.double_quant = w.shape, block_size, double_quant
        blocks, absmax = _blocks(w.reshape(-1), block_size)
        codes = np.searchsorted(_MIDPOINTS, blocks / absmax[:, None]).astype(np.uint8)
        codes = codes.reshape(-1)
        if codes.size % 2:
            codes = np.concatenate([codes, np.zeros(1, np.uint8)])
        packed = (codes[0::2] << 4) | codes[1::2]                   # two codes per byte
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
    if isinstance(weight, (Tensor, NDArray)):
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

"""Quantized weight formats (``needle.quant``): NF4, as QLoRA stores frozen weights."""
from .nf4 import NF4MatMul, NF4MatMulT, NF4Tensor, nf4_codebook, quantize_nf4

"""Tensor parallelism (Megatron-LM, arXiv:1909.08053) and sequence parallelism (2205.05198); the
communication ops, Megatron's f and g, are in ``tp_comms.py``."""
from .attention import ParallelSelfAttention
from .cross_entropy import gathered_cross_entropy, vocab_parallel_cross_entropy
from .layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    allreduce_sequence_parallel_grads,
)
from .transformer import ParallelMLP, ParallelTransformerBlock

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "ParallelMLP", "ParallelSelfAttention", "ParallelTransformerBlock",
           "vocab_parallel_cross_entropy", "gathered_cross_entropy",
           "allreduce_sequence_parallel_grads"]

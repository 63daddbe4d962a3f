"""Tensor parallelism (Megatron-LM, arXiv:1909.08053) and sequence parallelism (2205.05198)."""
from .attention import ParallelSelfAttention
from .cross_entropy import gathered_cross_entropy, vocab_parallel_cross_entropy
from .layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    allreduce_sequence_parallel_grads,
)
from .tp_comms import (
    copy_to_region,
    gather_from_region,
    gather_from_sequence_region,
    reduce_from_region,
    reduce_scatter_to_sequence_region,
    scatter_to_region,
    scatter_to_sequence_region,
)
from .transformer import ParallelMLP, ParallelTransformerBlock

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "ParallelMLP", "ParallelSelfAttention", "ParallelTransformerBlock",
           "vocab_parallel_cross_entropy", "gathered_cross_entropy",
           "allreduce_sequence_parallel_grads",
           "copy_to_region", "reduce_from_region", "gather_from_region", "scatter_to_region",
           "gather_from_sequence_region", "reduce_scatter_to_sequence_region",
           "scatter_to_sequence_region"]

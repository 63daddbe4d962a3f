"""ZeRO (Rajbhandari et al., SC 2020) and FSDP (Zhao et al., VLDB 2023): shard the model states."""
from ..data_parallel.flat_layout import owned_pieces
from .fsdp import FullyShardedDataParallel
from .zero_optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer", "FullyShardedDataParallel", "owned_pieces"]

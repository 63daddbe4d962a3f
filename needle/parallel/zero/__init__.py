"""ZeRO (Rajbhandari et al., SC 2020) and FSDP (Zhao et al., VLDB 2023): shard the model states."""
from .flat_param import FlatParamUnit
from .fsdp import FullyShardedDataParallel
from .sharding import Piece, chunk_cols, owned_pieces
from .zero_optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer", "FullyShardedDataParallel", "FlatParamUnit", "Piece",
           "chunk_cols", "owned_pieces"]

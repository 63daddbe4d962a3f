"""ZeRO (Rajbhandari et al., SC 2020) and FSDP (Zhao et al., VLDB 2023): shard the model states.

``sharding.py`` (which rank owns which elements, pure functions), ``zero_optimizer.py``
(``ZeroRedundancyOptimizer``, stages 1 and 2), ``flat_param.py`` (a wrapped submodule's
parameters as one flat shard: gather, free, reduce-scatter), ``fsdp.py``
(``FullyShardedDataParallel``, stage 3) and ``fsdp_checkpoint.py`` (full and sharded checkpoints).
"""
from .flat_param import FlatParamUnit
from .fsdp import FullyShardedDataParallel
from .sharding import Piece, chunk_cols, owned_pieces
from .zero_optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer", "FullyShardedDataParallel", "FlatParamUnit", "Piece",
           "chunk_cols", "owned_pieces"]

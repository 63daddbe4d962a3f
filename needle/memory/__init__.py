"""Memory-saving training: measure it, then save it (checkpointing, accumulation, estimates)."""
from .accumulate import accumulate_gradients, split_batch
from .checkpoint import (
    Checkpoint,
    NondeterministicCheckpoint,
    checkpoint,
    checkpoint_sequential,
    segment_bounds,
)
from .checkpoint_boundaries import (
    CheckpointSegments,
    choose_checkpoints,
    evaluate_segments,
    profile_chain,
)
from .estimator import MemoryEstimate, TransformerConfig, estimate_module, estimate_transformer
from .offload import OffloadOptimizer
from .tracker import CATEGORIES, MemoryTracker, buffers_of, bytes_of

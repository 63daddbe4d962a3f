"""Memory-saving training: measure it, then save it (checkpointing, accumulation, estimates)."""
from .tracker import CATEGORIES, MemoryTracker, buffers_of, bytes_of  # noqa: F401
from .checkpoint import (Checkpoint, NondeterministicCheckpoint, checkpoint,  # noqa: F401
                         checkpoint_sequential, segment_bounds)
from .planner import (CheckpointPlan, brute_force_plan, evaluate_plan,  # noqa: F401
                      plan_checkpoints, profile_chain)
from .accumulate import accumulate_gradients, split_batch  # noqa: F401
from .offload import OffloadOptimizer  # noqa: F401
from .estimator import (MemoryEstimate, TransformerConfig, estimate_module,  # noqa: F401
                        estimate_transformer)

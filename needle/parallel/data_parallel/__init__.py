"""Data parallelism: replicas of the whole model, gradients averaged across ranks.

``ddp.py`` (``DataParallelNaive``, then ``DistributedDataParallel``), ``buckets.py`` (the
gradient buckets DDP reduces, and ZeRO-2 and FSDP reduce-scatter), ``flat_layout.py`` (many
tensors as one padded flat vector: buckets, ZeRO's shards, FSDP's flat parameters),
``grad_hooks.py`` (a hook per gradient and one callback when backward ends, for all of them),
``replicas.py`` (checking shapes and broadcasting rank 0's values so that every replica starts
equal: ``replicate_from_rank0``).
"""
from .buckets import Bucket, BucketReducer, assign_buckets
from .ddp import DataParallelNaive, DistributedDataParallel
from .flat_layout import FlatLayout
from .grad_hooks import BackwardHooks
from .replicas import broadcast_tensors, check_same_shapes, replicate_from_rank0

__all__ = ["DataParallelNaive", "DistributedDataParallel", "Bucket", "BucketReducer",
           "assign_buckets", "broadcast_tensors", "check_same_shapes", "replicate_from_rank0",
           "FlatLayout", "BackwardHooks"]

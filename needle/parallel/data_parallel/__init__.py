"""Data parallelism: replicas of the whole model, gradients averaged across ranks.

``ddp.py`` (the strategies), ``buckets.py`` (gradient buckets), ``flat_layout.py`` (tensors as
one padded flat vector), ``grad_hooks.py`` (backward hooks), ``replicas.py`` (equal replicas).
"""
from .buckets import Bucket, BucketReducer, assign_buckets
from .ddp import DataParallelNaive, DistributedDataParallel
from .flat_layout import FlatLayout
from .grad_hooks import BackwardHooks
from .replicas import broadcast_tensors, check_same_shapes, replicate_from_rank0

__all__ = ["DataParallelNaive", "DistributedDataParallel", "Bucket", "BucketReducer",
           "assign_buckets", "broadcast_tensors", "check_same_shapes", "replicate_from_rank0",
           "FlatLayout", "BackwardHooks"]

"""Data parallelism: replicas of the whole model, gradients averaged across ranks.

``ddp.py`` (``DataParallelNaive``, then ``DistributedDataParallel``), ``buckets.py`` (the
gradient buckets DDP reduces), ``replicas.py`` (checking shapes and broadcasting rank 0's
values so that every replica starts equal).
"""
from .buckets import Bucket, BucketReducer, assign_buckets
from .ddp import DataParallelNaive, DistributedDataParallel
from .replicas import broadcast_tensors, check_same_shapes, replicate_from_rank0

__all__ = ["DataParallelNaive", "DistributedDataParallel", "Bucket", "BucketReducer",
           "assign_buckets", "broadcast_tensors", "check_same_shapes", "replicate_from_rank0"]

"""Data parallelism: replicas of the whole model, gradients averaged across ranks."""
from .buckets import Bucket, BucketReducer, assign_buckets
from .ddp import DataParallelNaive, DistributedDataParallel
from .flat_layout import FlatLayout
from .grad_hooks import BackwardHooks
from .replicas import broadcast_tensors, check_same_shapes, replicate_from_rank0

__all__ = ["DataParallelNaive", "DistributedDataParallel", "Bucket", "BucketReducer",
           "assign_buckets", "broadcast_tensors", "check_same_shapes", "replicate_from_rank0",
           "FlatLayout", "BackwardHooks"]

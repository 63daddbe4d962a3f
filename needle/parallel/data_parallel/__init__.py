"""Data parallelism: replicas of the whole model, gradients averaged across ranks."""
from .buckets import assign_buckets
from .ddp import DataParallelNaive, DistributedDataParallel

__all__ = ["DataParallelNaive", "DistributedDataParallel", "assign_buckets"]

"""Data loading: datasets, batching and augmentation (``ndl.data``)."""
from .data_basic import DataLoader, Dataset
from .data_transforms import RandomCrop, RandomFlipHorizontal, Transform
from .datasets import *
from .samplers import DistributedSampler, Sampler, SequentialSampler

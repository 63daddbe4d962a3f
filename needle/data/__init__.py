"""Data loading: datasets, batching and augmentation (``ndl.data``)."""
from .data_basic import DataLoader, Dataset  # noqa: F401
from .data_transforms import RandomCrop, RandomFlipHorizontal, Transform  # noqa: F401
from .datasets import *  # noqa: F401,F403

"""A dataset over in-memory arrays."""
from typing import Any, Tuple

import numpy as np

from ..data_basic import Dataset


class NDArrayDataset(Dataset):
    """Samples are the rows ``(arrays[0][i], arrays[1][i], ...)`` of equally long arrays."""

    batch_indexable = True

    def __init__(self, *arrays: Any):
        super().__init__()
        if not arrays:
            raise ValueError("NDArrayDataset needs at least one array")
        self.arrays = [a.numpy() if hasattr(a, "numpy") else np.asarray(a) for a in arrays]
        lengths = [a.shape[0] if a.ndim else -1 for a in self.arrays]
        if min(lengths) < 0 or len(set(lengths)) != 1:
            raise ValueError(f"NDArrayDataset: arrays must share a first dimension, got shapes "
                             f"{[a.shape for a in self.arrays]}")

    def __len__(self) -> int:
        return self.arrays[0].shape[0]

    def __getitem__(self, i: Any) -> Tuple[np.ndarray, ...]:
        return tuple(a[i] for a in self.arrays)

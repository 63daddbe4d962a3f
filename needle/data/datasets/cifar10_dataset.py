"""CIFAR-10 from the python batches (restricted unpickler) or the binary ``.bin`` batches."""
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..data_basic import Dataset
from .restricted_pickle import safe_unpickle

_TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
_TEST = ["test_batch"]
_RECORD = 1 + 3 * 32 * 32  # binary format: one label byte, then the CHW image bytes
_CLASSES = 10


def _key(d: Dict[Any, Any], name: str, filename: str) -> Any:
    for k in (name, name.encode()):
        if k in d:
            return d[k]
    raise ValueError(f"malformed CIFAR-10 file {filename}: no {name!r} entry "
                     f"(keys {sorted(map(str, d))})")


def load_python_batch(filename: str) -> Tuple[np.ndarray, np.ndarray]:
    """One python batch: uint8 images (N, 3072) and int64 labels (N,)."""
    d = safe_unpickle(filename)
    if not isinstance(d, dict):
        raise ValueError(f"malformed CIFAR-10 file {filename}: expected a dict, got "
                         f"{type(d).__name__}")
    data = _pixels(_key(d, "data", filename), filename)
    labels = _labels(_key(d, "labels", filename), filename)
    if labels.shape != (data.shape[0],):
        raise ValueError(f"malformed CIFAR-10 file {filename}: {data.shape[0]} images but "
                         f"{labels.shape[0]} labels")
    return data, labels


def _pixels(data: Any, filename: str) -> np.ndarray:
    """The images: an (N, 3072) array of integers 0..255 (a cast would wrap or zero others)."""
    if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[1] != _RECORD - 1:
        shape = data.shape if isinstance(data, np.ndarray) else type(data).__name__
        raise ValueError(f"malformed CIFAR-10 file {filename}: data is {shape}; expected an "
                         "(N, 3072) uint8 array")
    if data.dtype != np.uint8:
        if data.dtype.kind not in "iu" or (data.size and (data.min() < 0 or data.max() > 255)):
            lo, hi = (data.min(), data.max()) if data.size else (0, 0)
            raise ValueError(f"malformed CIFAR-10 file {filename}: pixels are {data.dtype} in "
                             f"[{lo}, {hi}]; CIFAR-10 stores uint8 0..255 (rescale and cast "
                             "before writing)")
    return data.astype(np.uint8)


def _labels(labels: Any, filename: str) -> np.ndarray:
    """The labels: N integers in 0..9 (a list of Python ints, or an integer array)."""
    if isinstance(labels, list):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in labels):
            raise ValueError(f"malformed CIFAR-10 file {filename}: labels are not all integers")
        labels = np.array(labels, dtype=np.int64)
    if not isinstance(labels, np.ndarray) or labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise ValueError(f"malformed CIFAR-10 file {filename}: labels must be a list of ints "
                         f"(or a 1-d integer array), got {type(labels).__name__}")
    if labels.size and (labels.min() < 0 or labels.max() >= _CLASSES):
        raise ValueError(f"malformed CIFAR-10 file {filename}: labels in [{labels.min()}, "
                         f"{labels.max()}], outside 0..{_CLASSES - 1}")
    return labels.astype(np.int64)


def load_binary_batch(filename: str) -> Tuple[np.ndarray, np.ndarray]:
    """One binary batch (``data_batch_1.bin``): records of a label byte then 3072 pixel bytes."""
    if not os.path.isfile(filename):
        raise FileNotFoundError(f"CIFAR-10 file not found: {filename}")
    raw = np.fromfile(filename, dtype=np.uint8)
    if raw.size == 0 or raw.size % _RECORD:
        raise ValueError(f"malformed CIFAR-10 file {filename}: {raw.size} bytes is not a multiple "
                         f"of the {_RECORD}-byte record")
    rec = raw.reshape(-1, _RECORD)
    return rec[:, 1:].copy(), _labels(rec[:, 0], filename)


class CIFAR10Dataset(Dataset):
    """CIFAR-10 from its python or binary batches: images (3, 32, 32) float32 in [0, 1], int labels;
    transforms see H x W x C."""

    batch_indexable = True

    def __init__(self, base_folder: str, train: bool, p: Optional[float] = 0.5,
                 transforms: Optional[List[Any]] = None):
        super().__init__(transforms)
        self.p = p
        names = _TRAIN if train else _TEST
        if os.path.isfile(os.path.join(base_folder, names[0])):
            parts = [load_python_batch(os.path.join(base_folder, n)) for n in names]
        elif os.path.isfile(os.path.join(base_folder, names[0] + ".bin")):
            parts = [load_binary_batch(os.path.join(base_folder, n + ".bin")) for n in names]
        else:
            first = os.path.join(base_folder, names[0])
            raise FileNotFoundError(f"CIFAR-10 file not found: {first} (nor {first}.bin)")
        data = np.concatenate([x for x, _ in parts])
        self.X = (data.astype(np.float32) / np.float32(255.0)).reshape(-1, 3, 32, 32)
        self.y = np.concatenate([y for _, y in parts])

    def __getitem__(self, index: Any) -> Tuple[np.ndarray, Any]:
        x, y = self.X[index], self.y[index]
        if not self.transforms:
            return x, y
        imgs = x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # to H x W x C
        out = np.stack([self.apply_transforms(img) for img in imgs]).transpose(0, 3, 1, 2)
        return (out[0] if np.ndim(index) == 0 else np.ascontiguousarray(out)), y

    def __len__(self) -> int:
        return self.y.shape[0]

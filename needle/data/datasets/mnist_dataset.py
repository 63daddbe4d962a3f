"""MNIST from the IDX ``.gz`` files (http://yann.lecun.com/exdb/mnist/ format)."""
import gzip
import math
import os
import struct
import zlib
from typing import Any, List, Optional, Tuple

import numpy as np

from ... import numbers
from ..data_basic import Dataset

CLASSES = 10  # digits 0..9
MAX_IDX_BYTES = 1 << 31  # 2 GiB: MNIST's largest file holds 47 MB, EMNIST's 700 MB
_MAX_NDIM = 8


def read_idx(filename: str, max_bytes: int = MAX_IDX_BYTES) -> np.ndarray:
    """Read a (gzipped) IDX file of unsigned bytes into a uint8 array of its stated shape.

    The header's shape bounds the read: a file (a gzip bomb) holding more bytes than it
    declares is refused after reading one byte more, never decompressed whole."""
    if not isinstance(filename, (str, os.PathLike)):
        raise TypeError(f"MNIST: a file name is a str, got {type(filename).__name__}")
    filename = os.fspath(filename)
    max_bytes = numbers.count_arg(max_bytes, "read_idx: max_bytes", lo=0)  # nan: no bound
    if not os.path.isfile(filename):
        raise FileNotFoundError(f"MNIST file not found: {filename}")
    opener = gzip.open if filename.endswith(".gz") else open
    try:
        with opener(filename, "rb") as f:
            shape = _idx_shape(f, filename, max_bytes)
            count = math.prod(shape)
            raw = f.read(count + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"malformed MNIST file {filename}: {e}") from None
    if len(raw) != count:
        more = "more than" if len(raw) > count else f"but {len(raw)} bytes follow, not"
        raise ValueError(f"malformed MNIST file {filename}: header says shape {shape} "
                         f"({count} bytes) {more} that many")
    return np.frombuffer(raw, dtype=np.uint8).reshape(shape)


def _idx_shape(f: Any, filename: str, max_bytes: int) -> Tuple[int, ...]:
    """The shape an IDX header declares, checked to be at most ``max_bytes``."""
    magic = f.read(4)
    if len(magic) < 4 or magic[:3] != b"\0\0\x08" or not 1 <= magic[3] <= _MAX_NDIM:
        raise ValueError(f"malformed MNIST file {filename}: not an IDX file of unsigned bytes "
                         f"(header {magic!r})")
    dims = f.read(4 * magic[3])
    if len(dims) < 4 * magic[3]:
        raise ValueError(f"malformed MNIST file {filename}: truncated header")
    shape = struct.unpack(f">{magic[3]}I", dims)
    if math.prod(shape) > max_bytes:
        raise ValueError(f"malformed MNIST file {filename}: header says shape {shape}, "
                         f"{math.prod(shape)} bytes, more than the {max_bytes} allowed")
    return shape


def parse_mnist(image_filename: str, label_filename: str) -> Tuple[np.ndarray, np.ndarray]:
    """Images as float32 (N, 784) scaled to [0, 1] and labels as uint8 (N,)."""
    ### BEGIN YOUR SOLUTION (hw0.simple_ml.parse_mnist)
    images = read_idx(image_filename)
    labels = read_idx(label_filename)
    if images.ndim != 3 or labels.ndim != 1:
        raise ValueError(f"MNIST: expected images (N, H, W) in {image_filename} and labels (N,) "
                         f"in {label_filename}, got {images.shape} and {labels.shape}")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"MNIST: {image_filename} has {images.shape[0]} images but "
                         f"{label_filename} has {labels.shape[0]} labels")
    X = images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(255.0)
    return X, labels.copy()
    ### END YOUR SOLUTION


def check_labels(labels: np.ndarray, filename: str) -> np.ndarray:
    """``labels`` when each is a digit 0..9 (as CIFAR-10's reader checks); else a ValueError
    naming the file and the range found (a label 200 once trained on in silence)."""
    if labels.size and int(labels.max()) >= CLASSES:
        bad = int(np.argmax(labels >= CLASSES))
        raise ValueError(f"malformed MNIST file {filename}: labels in [{int(labels.min())}, "
                         f"{int(labels.max())}], outside 0..{CLASSES - 1} (label {bad} is "
                         f"{int(labels[bad])})")
    return labels


class MNISTDataset(Dataset):
    """MNIST digits: each sample is a flat 784-vector in [0, 1] and its label."""

    batch_indexable = True

    def __init__(self, image_filename: str, label_filename: str,
                 transforms: Optional[List[Any]] = None):
        super().__init__(transforms)
        self.images, labels = parse_mnist(image_filename, label_filename)
        self.labels = check_labels(labels, label_filename)

    def __getitem__(self, index: Any) -> Tuple[np.ndarray, Any]:
        kind = getattr(np.asarray(index) if not isinstance(index, slice) else None, "dtype", None)
        if kind is not None and kind.kind not in "iu":  # 1.5, "a": NumPy's message, not ours
            raise TypeError(f"MNISTDataset index must be a whole number, a slice or integer "
                            f"indices, got {index!r}")
        x, y = self.images[index], self.labels[index]
        if not self.transforms:
            return x, y
        # transforms act on single H x W x C images
        imgs = x.reshape(-1, 28, 28, 1)
        out = np.stack([self.apply_transforms(img) for img in imgs]).reshape(-1, 28 * 28)
        return (out[0] if np.ndim(index) == 0 else out), y

    def __len__(self) -> int:
        return self.images.shape[0]

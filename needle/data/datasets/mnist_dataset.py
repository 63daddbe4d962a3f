"""MNIST from the IDX ``.gz`` files (http://yann.lecun.com/exdb/mnist/ format)."""
import gzip
import os
import struct
from typing import Any, List, Optional, Tuple

import numpy as np

from ..data_basic import Dataset


def read_idx(filename: str) -> np.ndarray:
    """Read a (gzipped) IDX file of unsigned bytes into a uint8 array of its stated shape."""
    if not os.path.isfile(filename):
        raise FileNotFoundError(f"MNIST file not found: {filename}")
    opener = gzip.open if filename.endswith(".gz") else open
    try:
        with opener(filename, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise ValueError(f"malformed MNIST file {filename}: {e}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"malformed MNIST file {filename}: not an IDX file of unsigned bytes "
                         f"(header {raw[:4]!r})")
    ndim = raw[3]
    head = 4 + 4 * ndim
    if len(raw) < head:
        raise ValueError(f"malformed MNIST file {filename}: truncated header")
    shape = struct.unpack(f">{ndim}I", raw[4:head])
    count = int(np.prod(shape))
    if len(raw) - head != count:
        raise ValueError(f"malformed MNIST file {filename}: header says shape {shape} "
                         f"({count} bytes) but {len(raw) - head} bytes follow")
    return np.frombuffer(raw, dtype=np.uint8, offset=head).reshape(shape)


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


class MNISTDataset(Dataset):
    """MNIST digits: each sample is a flat 784-vector in [0, 1] and its label."""

    batch_indexable = True

    def __init__(self, image_filename: str, label_filename: str,
                 transforms: Optional[List[Any]] = None):
        super().__init__(transforms)
        self.images, self.labels = parse_mnist(image_filename, label_filename)

    def __getitem__(self, index: Any) -> Tuple[np.ndarray, Any]:
        x, y = self.images[index], self.labels[index]
        if not self.transforms:
            return x, y
        # transforms act on single H x W x C images
        imgs = x.reshape(-1, 28, 28, 1)
        out = np.stack([self.apply_transforms(img) for img in imgs]).reshape(-1, 28 * 28)
        return (out[0] if np.ndim(index) == 0 else out), y

    def __len__(self) -> int:
        return self.images.shape[0]

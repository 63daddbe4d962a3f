"""CIFAR-10 from the python batches (restricted unpickler) or the binary ``.bin`` batches."""
import io
import os
import pickle
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..data_basic import Dataset

_TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
_TEST = ["test_batch"]
_RECORD = 1 + 3 * 32 * 32  # binary format: one label byte, then the CHW image bytes


def _numpy_globals() -> Dict[Tuple[str, str], Any]:
    """The only callables a CIFAR pickle may reference: rebuilding plain numpy arrays."""
    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # numpy < 2
        from numpy.core import multiarray, numeric
    import codecs
    allowed = {}
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(mod, "_reconstruct")] = multiarray._reconstruct
        allowed[(mod, "scalar")] = multiarray.scalar
    for mod in ("numpy.core.numeric", "numpy._core.numeric"):
        allowed[(mod, "_frombuffer")] = numeric._frombuffer  # pickle protocol 5
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    allowed[("_codecs", "encode")] = codecs.encode  # how protocol 2 spells bytes objects
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickle plain containers, strings, numbers and numpy arrays; refuse anything else."""

    _ALLOWED = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to unpickle {module}.{name}: only plain containers and numpy arrays "
                "are allowed") from None


def safe_unpickle(filename: str) -> Any:
    """Load a pickle file with ``RestrictedUnpickler`` (CIFAR batches use latin1 strings)."""
    if not os.path.isfile(filename):
        raise FileNotFoundError(f"CIFAR-10 file not found: {filename}")
    with open(filename, "rb") as f:
        raw = f.read()
    try:
        obj = RestrictedUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except pickle.UnpicklingError as e:
        raise ValueError(f"malformed or unsafe CIFAR-10 file {filename}: {e}") from None
    except Exception as e:  # truncated or garbage data
        raise ValueError(f"malformed CIFAR-10 file {filename}: {type(e).__name__}: {e}") from None
    return obj


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
    data = np.asarray(_key(d, "data", filename))
    labels = np.asarray(_key(d, "labels", filename))
    if data.dtype == object or labels.dtype == object or data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"malformed CIFAR-10 file {filename}: data {data.shape} {data.dtype}, "
                         f"labels {labels.shape} {labels.dtype}; expected (N, 3072) uint8")
    if labels.shape != (data.shape[0],):
        raise ValueError(f"malformed CIFAR-10 file {filename}: {data.shape[0]} images but "
                         f"labels of shape {labels.shape}")
    return data.astype(np.uint8), labels.astype(np.int64)


def load_binary_batch(filename: str) -> Tuple[np.ndarray, np.ndarray]:
    """One binary batch (``data_batch_1.bin``): records of a label byte then 3072 pixel bytes."""
    if not os.path.isfile(filename):
        raise FileNotFoundError(f"CIFAR-10 file not found: {filename}")
    raw = np.fromfile(filename, dtype=np.uint8)
    if raw.size == 0 or raw.size % _RECORD:
        raise ValueError(f"malformed CIFAR-10 file {filename}: {raw.size} bytes is not a multiple "
                         f"of the {_RECORD}-byte record")
    rec = raw.reshape(-1, _RECORD)
    return rec[:, 1:].copy(), rec[:, 0].astype(np.int64)


class CIFAR10Dataset(Dataset):
    """CIFAR-10: images (3, 32, 32) float32 in [0, 1] with int labels.

    ``base_folder`` holds either the python batches (``data_batch_1`` ... ``test_batch``) or
    the binary ones (``data_batch_1.bin`` ... ``test_batch.bin``). Transforms see H x W x C.
    """

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

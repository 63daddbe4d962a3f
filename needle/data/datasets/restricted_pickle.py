"""Unpickle data files without trusting them (a pickle is a program): only plain numpy arrays,
a capped size, and no shared references or more nodes than bytes (a 1 kB pickle bomb)."""
import io
import os
import pickle
from typing import Any, Callable, Dict, Tuple

import numpy as np

MAX_FILE_BYTES = 1 << 28  # 256 MiB: a CIFAR-10 python batch is 31 MB


def _plain_dtype(*args: Any) -> np.dtype:
    """``numpy.dtype(...)`` for anything but object (and structured) dtypes."""
    dtype = np.dtype(*args)
    if dtype.hasobject or dtype.fields is not None:
        raise pickle.UnpicklingError(f"refusing dtype {dtype}: only plain numeric arrays")
    return dtype


def _numpy_globals() -> Dict[Tuple[str, str], Callable[..., Any]]:
    """The only callables a data pickle may reference: rebuilding plain numpy arrays."""
    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # numpy < 2
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]
    import codecs
    allowed: Dict[Tuple[str, str], Callable[..., Any]] = {}
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(mod, "_reconstruct")] = multiarray._reconstruct
        allowed[(mod, "scalar")] = multiarray.scalar
    for mod in ("numpy.core.numeric", "numpy._core.numeric"):
        # pickle protocol 5; private, so NumPy's stubs lack it
        allowed[(mod, "_frombuffer")] = numeric._frombuffer  # type: ignore[attr-defined]
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = _plain_dtype
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


def _check_tree(obj: Any, budget: int, filename: str) -> None:
    """Refuse shared containers (memo amplification) and trees larger than ``budget`` nodes."""
    seen, stack, nodes = set(), [obj], 0
    while stack:
        node = stack.pop()
        nodes += 1
        if nodes > budget:
            raise ValueError(f"malformed data file {filename}: more objects than its "
                             f"{budget} bytes can hold (memo references?)")
        if isinstance(node, np.ndarray) and node.dtype.hasobject:
            raise ValueError(f"malformed data file {filename}: an object array")
        if not isinstance(node, (dict, list, tuple)):
            continue
        if id(node) in seen:
            raise ValueError(f"malformed data file {filename}: one {type(node).__name__} is "
                             "referenced twice (memo references); refused")
        seen.add(id(node))
        stack.extend(node.values() if isinstance(node, dict) else node)
        if isinstance(node, dict):
            stack.extend(node.keys())


def safe_unpickle(filename: str, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Load a pickle file with ``RestrictedUnpickler`` (CIFAR batches use latin1 strings)."""
    if not os.path.isfile(filename):
        raise FileNotFoundError(f"data file not found: {filename}")
    size = os.path.getsize(filename)
    if size > max_bytes:
        raise ValueError(f"data file {filename} is {size} bytes, more than the {max_bytes} "
                         "a pickled batch may have")
    with open(filename, "rb") as f:
        raw = f.read(max_bytes + 1)
    try:
        obj = RestrictedUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except pickle.UnpicklingError as e:
        raise ValueError(f"malformed or unsafe data file {filename}: {e}") from None
    except Exception as e:  # truncated or garbage data
        raise ValueError(f"malformed data file {filename}: {type(e).__name__}: {e}") from None
    _check_tree(obj, len(raw), filename)
    return obj

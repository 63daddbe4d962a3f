"""Devices: a ``BackendDevice`` pairs a name with the backend module implementing the primitives.
Kinds besides ``cpu`` are registered by their backend, so this layer imports none above it."""
import contextlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import ndarray_backend_numpy
from .dtypes import to_numpy_dtype


class BackendDevice:
    """A device (``cpu()`` or ``cuda(i)``) and the module holding its array primitives."""

    def __init__(self, name: str, mod: Any, index: int = 0):
        self.name = name
        self.mod = mod
        self.index = index
        if mod is not None:
            # copy the primitives onto the instance: a plain attribute lookup on the hot path
            self.__dict__.update({k: getattr(mod, k) for k in dir(mod) if not k.startswith("__")})

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, BackendDevice) and self.name == other.name
                and self.index == other.index)

    def __hash__(self) -> int:
        return hash((self.name, self.index))

    def __repr__(self) -> str:
        if self.name != "cuda":
            return self.name + "()"
        emulated = getattr(self.__dict__.get("mod"), "EMULATED", False)  # NEEDLE_CUDA_EMULATOR
        return f"cuda({self.index}, emulated)" if emulated else f"cuda({self.index})"

    def __getattr__(self, name: str) -> Any:
        mod = self.__dict__.get("mod")
        if mod is None:
            # AttributeError (not RuntimeError), so hasattr/getattr(d, name, default) and
            # pytest's parameter ids work on a disabled device, as they do in the course
            raise AttributeError(f"device {self!r} is not enabled (no backend available), "
                                 f"so it has no attribute {name!r}")
        return getattr(mod, name)

    def enabled(self) -> bool:
        """True when this device's backend can run here."""
        return self.mod is not None

    def constant(self, key: Any, make: Callable[[], np.ndarray], dtype: Any) -> Any:
        """An NDArray of ``make()`` on this device, made once per ``key`` and kept (read it,
        never write it): a causal mask, position ids, uploaded once instead of every step.
        Made with the device's own primitives even while ``needle.compile`` records (the
        recorder's ``paused``), so a compiled step sees it as a leaf from its first call."""
        cache = self.__dict__.setdefault("_constants", {})
        arr = cache.get(key)
        if arr is None:
            recorder = self.__dict__.get("_needle_recorder")
            with recorder.paused() if recorder is not None else contextlib.nullcontext():
                arr = self._from_numpy(make(), dtype)
            if len(cache) >= 64:
                cache.clear()
            cache[key] = arr
        return arr

    def _from_numpy(self, arr: np.ndarray, dtype: Any) -> "Any":
        from .ndarray import NDArray
        return NDArray(arr, device=self, dtype=dtype)

    def randn(self, *shape: int, dtype: Any = "float32") -> Any:
        """Standard normal samples, drawn from NumPy's global RNG (seed with np.random.seed)."""
        return self._from_numpy(np.random.randn(*shape), dtype)

    def rand(self, *shape: int, dtype: Any = "float32") -> Any:
        """Uniform [0, 1) samples from NumPy's global RNG."""
        return self._from_numpy(np.random.rand(*shape), dtype)

    def one_hot(self, n: int, i: Any, dtype: Any = "float32") -> Any:
        """Rows of the n x n identity selected by the integer indices ``i`` (NumPy, or an
        NDArray on this device); no n x n identity is built (at a vocabulary of 8192 that was
        256 MiB per call, copied to the GPU)."""
        from .ndarray import NDArray
        if isinstance(i, NDArray) and i.device == self:
            return self._one_hot_here(n, i, dtype)
        idx = np.asarray(i.numpy() if hasattr(i, "numpy") else i).astype(np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"one_hot indices must lie in [0, {n}), got range "
                             f"[{idx.min()}, {idx.max()}]")
        hot = np.zeros(idx.shape + (n,), dtype=np.float32)
        np.put_along_axis(hot, idx[..., None], 1.0, axis=-1)
        return self._from_numpy(hot, dtype)

    def _one_hot_here(self, n: int, i: Any, dtype: Any) -> Any:
        """``i[..., None] == arange(n)`` on this device, for indices already here."""
        from .functions import take_rows
        arange = self.constant(("arange", n), lambda: np.arange(n).reshape(n, 1), "int64")
        # take_rows from arange returns the indices themselves, checked to lie in [0, n) (on
        # every replay of a compiled step, too)
        rows = (i.size, n)
        labels = take_rows(arange, i).reshape((i.size, 1)).broadcast_to(rows)
        hot = labels == arange.reshape((1, n)).broadcast_to(rows)
        return hot.astype(to_numpy_dtype(dtype)).reshape(tuple(i.shape) + (n,))

    def empty(self, shape: Any, dtype: Any = "float32") -> Any:
        """An uninitialised array."""
        from .ndarray import NDArray
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return NDArray.make(shape, device=self, dtype=to_numpy_dtype(dtype))

    def full(self, shape: Any, fill_value: Any, dtype: Any = "float32") -> Any:
        """An array filled with ``fill_value``."""
        arr = self.empty(shape, dtype)
        arr.fill(fill_value)
        return arr


_CPU = BackendDevice("cpu", ndarray_backend_numpy)
# Backends above this package (``needle.backend_cuda``) register a kind here: the array layer
# knows devices by name only, never the modules implementing them. A factory returns the
# backend for one device index, or None where that device cannot run here.
BackendFactory = Callable[[int], Optional[Any]]
_FACTORIES: Dict[str, BackendFactory] = {}
_DEVICES: Dict[Tuple[str, int], BackendDevice] = {}


def register_device_kind(name: str, factory: BackendFactory) -> None:
    """Make ``device(name, i)`` build its backend with ``factory(i)`` (replacing any before)."""
    if name == "cpu":
        raise ValueError("register_device_kind: 'cpu' is built in (the NumPy backend)")
    _FACTORIES[name] = factory
    for key in [k for k in _DEVICES if k[0] == name]:
        del _DEVICES[key]  # devices made before registering were disabled: build them again


def device(name: str, index: int = 0) -> BackendDevice:
    """Device ``index`` of kind ``name``; disabled (``enabled()`` False) where it cannot run."""
    if name == "cpu":
        return _CPU
    key = (name, index)
    if key not in _DEVICES:
        # no factory: nobody registered the kind (needle.backend_cuda registers "cuda")
        factory = _FACTORIES.get(name)
        _DEVICES[key] = BackendDevice(name, factory(index) if factory else None, index)
    return _DEVICES[key]


def cpu() -> BackendDevice:
    """The CPU device (NumPy backend)."""
    return _CPU


def cpu_numpy() -> BackendDevice:
    """Alias of ``cpu()``: the CPU backend is NumPy underneath."""
    return _CPU


def cuda(index: int = 0) -> BackendDevice:
    """CUDA GPU ``index`` (CuPy backend); ``enabled()`` is False where no GPU/CuPy is present."""
    return device("cuda", index)


def default_device() -> BackendDevice:
    """The device used when none is given."""
    return _CPU


def all_devices() -> List[BackendDevice]:
    """Every device needle knows about (enabled or not)."""
    return [cpu(), cuda()]

"""Dataset and DataLoader: index a dataset, group indices into batches, yield Tensors."""
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .. import numbers
from ..autograd import Tensor
from ..backend_ndarray.device import BackendDevice
from ..backend_ndarray.dtypes import SUPPORTED
from ..process_state import switches


class Dataset:
    """An indexable collection of samples; subclasses define ``__getitem__`` and ``__len__``."""

    #: True when ``self[idx]`` accepts an integer array and returns already-batched arrays.
    batch_indexable = False

    def __init__(self, transforms: Optional[List[Any]] = None):
        if transforms is not None and (not isinstance(transforms, (list, tuple)) or not all(
                callable(t) for t in transforms)):  # else a TypeError at the first sample
            raise TypeError(f"{type(self).__name__}: transforms must be a list of callables "
                            f"(x -> x), got {transforms!r:.80}")
        self.transforms = transforms

    def __getitem__(self, index: Any) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def apply_transforms(self, x: np.ndarray) -> np.ndarray:
        """Apply the dataset's transforms, in order, to one sample."""
        if self.transforms is not None:
            for tform in self.transforms:
                x = tform(x)
        return x


def _to_tensor(x: Any, device: Optional[BackendDevice], dtype: Optional[str]) -> Tensor:
    """Floating data becomes ``dtype`` (float32 by default); integer and bool data keep theirs."""
    arr = np.asarray(x)
    if arr.dtype.kind in "iub":
        dtype = arr.dtype.name if arr.dtype.name in SUPPORTED else "int64"
    return Tensor(arr, device=device, dtype=dtype or "float32", requires_grad=False)


def _collate(samples: Sequence[Any]) -> Tuple[np.ndarray, ...]:
    """Stack a list of per-sample tuples into one array per field."""
    first = samples[0]
    if not isinstance(first, (tuple, list)):
        return (np.stack([np.asarray(s) for s in samples]),)
    return tuple(np.stack([np.asarray(s[k]) for s in samples]) for k in range(len(first)))


class DataLoader:
    """Iterate over a dataset in (optionally shuffled) batches of ``ndl.Tensor``.

    Shuffling draws one permutation per epoch from ``generator`` (an ``np.random.Generator``,
    or one built from ``seed``); with neither, NumPy's global RNG is used, as in the course.
    A ``sampler`` (e.g. ``DistributedSampler``) replaces shuffling: it lists the indices.
    ``state_dict()`` / ``load_state_dict()`` capture the position inside an epoch so training
    resumed from a checkpoint sees exactly the batches it would have seen.
    """

    def __init__(self, dataset: Dataset, batch_size: Optional[int] = 1, shuffle: bool = False,
                 drop_last: bool = False, device: Optional[BackendDevice] = None,
                 dtype: Optional[str] = None, generator: Optional[np.random.Generator] = None,
                 seed: Optional[int] = None, sampler: Optional[Any] = None):
        if sampler is not None and (shuffle or generator is not None or seed is not None):
            raise ValueError("DataLoader: sampler decides the order; do not also pass shuffle, "
                             "generator or seed")
        if sampler is not None and not all(hasattr(sampler, a) for a in ("__iter__", "__len__")):
            raise TypeError(f"DataLoader: sampler must be iterable with a length, got "
                            f"{type(sampler).__name__}")
        if batch_size is None:
            raise ValueError("DataLoader: batch_size must be a whole number >= 1, got None")
        # a whole number: 2.5 once ran as 2, and -1 as an error deep in np.array_split
        batch_size = numbers.count(batch_size, "DataLoader: batch_size", lo=1)
        if generator is not None and seed is not None:
            raise ValueError("DataLoader: pass either generator or seed, not both")
        if seed is not None:  # -1 and 1.5 ended deep in NumPy's SeedSequence
            seed = numbers.count_arg(seed, "DataLoader: seed", lo=0)
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise TypeError(f"DataLoader: dataset must have a length and items (a Dataset), got "
                            f"{type(dataset).__name__}")
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if flag is not True and flag is not False:  # 'no' would read as True
                raise TypeError(f"DataLoader: {name} must be True or False, got {flag!r}")
        if generator is not None and not isinstance(generator, np.random.Generator):
            raise TypeError("DataLoader: generator must be a numpy.random.Generator, got "
                            f"{type(generator).__name__}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.device = device
        self.dtype = dtype
        self.generator = generator if seed is None else np.random.default_rng(seed)
        self.sampler = sampler
        self.ordering: List[np.ndarray] = []
        self._position = 0  # batches of the current ordering already yielded
        self._resume = False

    def __len__(self) -> int:
        n = len(self.dataset) if self.sampler is None else len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _new_ordering(self) -> List[np.ndarray]:
        """Exercise hw2.data.dataloader: the epoch's batches of indices: ``order`` (a permutation
        when shuffling, else arange) split every ``batch_size`` (np.array_split; the last may be
        short, and is dropped with drop_last)."""
        n = len(self.dataset)
        if self.sampler is not None:  # e.g. a DistributedSampler: this rank's indices
            order = np.fromiter(iter(self.sampler), dtype=np.int64)
            n = len(order)
        elif self.shuffle:
            rng = self.generator if self.generator is not None else np.random
            order = rng.permutation(n)
        else:
            order = np.arange(n)
        ### BEGIN YOUR SOLUTION (hw2.data.dataloader)
        batches = np.array_split(order, range(self.batch_size, n, self.batch_size))
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches = batches[:-1]
        ### END YOUR SOLUTION
        return [b for b in batches if len(b)]

    def __iter__(self) -> Iterator[Tuple[Tensor, ...]]:
        if not self._resume:
            self.ordering = self._new_ordering()
            self._position = 0
        self._resume = False
        return self

    def __next__(self) -> Tuple[Tensor, ...]:
        if switches.profiler is not None:  # needle.profiler: a "dataloader" range
            with switches.profiler.range("DataLoader.__next__", "dataloader"):
                return self._next_batch()
        return self._next_batch()

    def _next_batch(self) -> Tuple[Tensor, ...]:
        if self._position >= len(self.ordering):
            raise StopIteration
        idx = self.ordering[self._position]
        self._position += 1
        return tuple(_to_tensor(x, self.device, self.dtype) for x in self._fetch(idx))

    def _fetch(self, idx: np.ndarray) -> Tuple[np.ndarray, ...]:
        if getattr(self.dataset, "batch_indexable", False):
            out = self.dataset[idx]
            return tuple(out) if isinstance(out, (tuple, list)) else (out,)
        return _collate([self.dataset[int(i)] for i in idx])

    def state_dict(self) -> Dict[str, Any]:
        """The epoch's batch order, how far it got, and the shuffle generator's state."""
        return {
            "ordering": np.concatenate(self.ordering) if self.ordering else np.zeros(0, np.int64),
            "batch_sizes": np.array([len(b) for b in self.ordering], dtype=np.int64),
            "position": self._position,
            "generator": None if self.generator is None else self.generator.bit_generator.state,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore ``state_dict()``: the next ``iter()`` continues the interrupted epoch."""
        missing = {"ordering", "batch_sizes", "position", "generator"} - set(state)
        if missing:
            raise ValueError(f"DataLoader.load_state_dict: missing keys {sorted(missing)}")
        order = np.asarray(state["ordering"], dtype=np.int64)
        sizes = np.asarray(state["batch_sizes"], dtype=np.int64)
        if int(sizes.sum()) != order.size:
            raise ValueError(f"DataLoader.load_state_dict: batch sizes sum to {int(sizes.sum())}"
                             f" but the ordering has {order.size} indices")
        self.ordering = np.split(order, np.cumsum(sizes)[:-1]) if sizes.size else []
        self._position = int(state["position"])
        if state["generator"] is not None:
            if self.generator is None:
                raise ValueError("DataLoader.load_state_dict: state has a generator but this "
                                 "loader uses the global RNG; pass generator= or seed=")
            self.generator.bit_generator.state = state["generator"]
        self._resume = self._position < len(self.ordering)

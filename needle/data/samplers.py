"""Samplers: which dataset indices a DataLoader visits, and in what order. ``DistributedSampler``
is PyTorch's; it is *told* its rank, it never asks MPI."""
import math
from typing import Iterator, Sized

import numpy as np

from .. import numbers


class Sampler:
    """An iterable of dataset indices with a length."""

    def __iter__(self) -> Iterator[int]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class SequentialSampler(Sampler):
    """0, 1, ..., len(dataset) - 1."""

    def __init__(self, dataset: Sized) -> None:
        if not hasattr(dataset, "__len__"):
            raise TypeError(f"SequentialSampler: dataset must have a length, got "
                            f"{type(dataset).__name__}")
        self.dataset = dataset

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.dataset)))

    def __len__(self) -> int:
        return len(self.dataset)


class DistributedSampler(Sampler):
    """This rank's share of each epoch's (shuffled) indices; every rank gets the same count."""

    def __init__(self, dataset: Sized, num_replicas: int, rank: int, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        for name, value in (("num_replicas", num_replicas), ("rank", rank), ("seed", seed)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise TypeError(f"DistributedSampler: {name} must be an int, got {value!r}")
        if num_replicas < 1:
            raise ValueError(f"DistributedSampler: num_replicas must be >= 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"DistributedSampler: rank {rank} is out of range for "
                             f"num_replicas={num_replicas} (valid ranks 0..{num_replicas - 1})")
        n = len(dataset)
        if n == 0:
            raise ValueError("DistributedSampler: the dataset is empty")
        if drop_last and n < num_replicas:
            raise ValueError(f"DistributedSampler: drop_last with {n} samples and "
                             f"{num_replicas} replicas leaves rank {rank} nothing")
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if flag is not True and flag is not False:  # 'no' read as True
                raise TypeError(f"DistributedSampler: {name} must be True or False, got {flag!r}")
        self.dataset = dataset
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        self.epoch = 0
        # drop_last: cut the tail so each rank has floor(n / N); else pad to ceil(n / N) each.
        self.num_samples = n // num_replicas if drop_last else math.ceil(n / num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Use the shuffle of ``epoch`` (call it on every rank before each epoch)."""
        self.epoch = numbers.count_arg(epoch, "DistributedSampler.set_epoch: epoch", lo=0)

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch, as an int64 array."""
        n = len(self.dataset)
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(n)
        else:
            order = np.arange(n)
        if self.total_size > n:  # pad by repeating the start (wrapping if needed)
            order = np.resize(order, self.total_size)
        order = order[:self.total_size]
        return order[self.rank:self.total_size:self.num_replicas].astype(np.int64)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (f"DistributedSampler(rank={self.rank}, num_replicas={self.num_replicas}, "
                f"shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last}, "
                f"epoch={self.epoch})")

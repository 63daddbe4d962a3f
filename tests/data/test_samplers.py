"""DistributedSampler: disjoint, covering, equal-length slices per rank; epochs; DataLoader."""
import numpy as np
import pytest

import needle as ndl
from needle.data import DataLoader, DistributedSampler


class Range(ndl.data.Dataset):
    def __init__(self, n):
        super().__init__()
        self.n = n

    def __getitem__(self, i):
        return np.array([float(i)], dtype=np.float32), np.int64(i)

    def __len__(self):
        return self.n


@pytest.mark.parametrize("n", [10, 11, 12, 3])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_partition_the_epoch(n, replicas, shuffle):
    parts = [DistributedSampler(Range(n), replicas, r, shuffle=shuffle, seed=5).indices()
             for r in range(replicas)]
    assert len({len(p) for p in parts}) == 1  # every rank runs the same number of steps
    everything = np.concatenate(parts)
    assert set(everything.tolist()) == set(range(n))  # every sample is seen
    assert len(everything) == -(-n // replicas) * replicas  # padded by at most replicas - 1
    if n % replicas == 0:
        assert sorted(everything.tolist()) == list(range(n))  # disjoint when it divides


def test_drop_last_gives_disjoint_floor_slices():
    parts = [DistributedSampler(Range(11), 3, r, drop_last=True).indices() for r in range(3)]
    flat = np.concatenate(parts)
    assert [len(p) for p in parts] == [3, 3, 3] and len(set(flat.tolist())) == 9


def test_unshuffled_is_round_robin():
    assert list(DistributedSampler(Range(7), 2, 1, shuffle=False)) == [1, 3, 5, 0]


def test_set_epoch_changes_the_shuffle_the_same_way_on_every_rank():
    s0 = [DistributedSampler(Range(20), 2, r, seed=3) for r in range(2)]
    e0 = [s.indices() for s in s0]
    for s in s0:
        s.set_epoch(1)
    e1 = [s.indices() for s in s0]
    assert not np.array_equal(e0[0], e1[0])
    assert sorted(np.concatenate(e1).tolist()) == list(range(20))
    again = DistributedSampler(Range(20), 2, 0, seed=3)
    again.set_epoch(1)
    np.testing.assert_array_equal(again.indices(), e1[0])  # reproducible from (seed, epoch)


def test_dataloader_with_sampler_yields_this_ranks_batches():
    ds = Range(10)
    seen = []
    for r in range(2):
        loader = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, 2, r, seed=1))
        assert len(loader) == 3
        for x, y in loader:
            assert x.shape[0] == y.shape[0] <= 2
            seen.extend(y.numpy().tolist())
    assert sorted(seen) == list(range(10))


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_replicas=2, rank=2), r"rank 2 is out of range for num_replicas=2"),
    (dict(num_replicas=2, rank=-1), r"rank -1 is out of range"),
    (dict(num_replicas=0, rank=0), r"num_replicas must be >= 1"),
    (dict(num_replicas=20, rank=0, drop_last=True), r"leaves rank 0 nothing"),
])
def test_bad_arguments_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DistributedSampler(Range(10), **kwargs)
    with pytest.raises(TypeError, match="rank must be an int"):
        DistributedSampler(Range(10), 2, 0.5)


def test_dataloader_rejects_sampler_with_shuffle():
    ds = Range(4)
    with pytest.raises(ValueError, match="sampler decides the order"):
        DataLoader(ds, sampler=DistributedSampler(ds, 1, 0), shuffle=True)
    with pytest.raises(TypeError, match="iterable with a length"):
        DataLoader(ds, sampler=3)

"""Fault injection, misuse: DDP ranks that disagree on ``no_sync()`` raise at their first synced
backward, on every rank, naming each rank's number of accumulated backward passes.

Before, rank 0's two no_sync backward passes plus its synced one were averaged with rank 1's
first backward (a silently wrong gradient) and the job then deadlocked in rank 1's next sync.
"""
import time

import numpy as np
import pytest
from mpi_helpers import BACKENDS, run_ranks

import needle as ndl
from needle import nn
from needle.parallel import DistributedDataParallel, virtual

pytestmark = pytest.mark.faults

WANT = "ranks disagree on no_sync(): backward passes accumulated at this sync"


def _backward_passes(comm, width, schedule):
    """Backward passes on rank 0 per ``schedule`` ("n": under no_sync, "s": synced), every
    other rank syncing each one; the first error's message, or None."""
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2))
    ddp = DistributedDataParallel(model, comm)
    x = ndl.Tensor(np.random.RandomState(comm.rank).randn(3, width).astype("float32"))
    mine = schedule if comm.rank == 0 else "s" * len(schedule)
    try:
        for kind in mine:
            if kind == "n":
                with ddp.no_sync():
                    ddp(x).sum().backward()
            else:
                ddp(x).sum().backward()
    except ValueError as err:
        return str(err)
    return None


# A 4-wide model fits in one small bucket (the fused recursive-doubling path); a 160-wide one
# in one bucket above ALLREDUCE_SMALL (the ring path, its check beside the first messages).
@pytest.mark.parametrize("width", [4, 160])
@pytest.mark.parametrize("size", [2, 3])
def test_ranks_disagreeing_on_no_sync_raise_on_every_rank(size, width):
    t0 = time.monotonic()
    msgs = virtual.run(size, _backward_passes, width, "nns", timeout=10)
    others = ", ".join(f"rank {r} has 1" for r in range(1, size))
    for r, msg in enumerate(msgs):
        assert msg is not None, r
        assert f"DistributedDataParallel (rank {r}): {WANT}" in msg, msg
        assert f"rank 0 has 3, {others}" in msg, msg
    assert time.monotonic() - t0 < 10  # at the first sync, not after a timeout


def test_disagreement_that_ends_at_the_same_count_is_caught_too():
    """Rank 0 syncs second, rank 1 first: rank 0's second pass meets rank 1's first."""
    msgs = virtual.run(2, _backward_passes, 4, "ns", timeout=10)
    for r, msg in enumerate(msgs):
        assert msg is not None and "rank 0 has 2, rank 1 has 1" in msg, (r, msg)


def test_ranks_agreeing_on_no_sync_raise_nothing():
    """Every rank accumulating the same number of passes: no error (the contexts agree)."""
    def agreeing(comm):
        np.random.seed(0)
        ddp = DistributedDataParallel(nn.Linear(4, 2), comm)
        x = ndl.Tensor(np.ones((3, 4), dtype="float32"))
        seen = []
        for _ in range(3):
            with ddp.no_sync():
                ddp(x).sum().backward()
            ddp(x).sum().backward()
            seen.append(ddp.module.weight.grad.numpy().copy())
        return seen
    for seen in virtual.run(2, agreeing, timeout=10):
        for grad in seen:  # d sum(x W) / dW = 3 (rows of ones) per pass, two passes summed
            np.testing.assert_allclose(grad, np.full((4, 2), 6.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_ranks_disagreeing_on_no_sync_raise_under_each_backend(backend):
    msgs = run_ranks(backend, 2, _backward_passes, 4, "nns", timeout=90,
                     env={"NEEDLE_COMM_TIMEOUT": "10"})
    for r, msg in enumerate(msgs):
        assert msg is not None and WANT in msg and "rank 0 has 3, rank 1 has 1" in msg, (r, msg)

"""Graded tests of the collectives unit (notebooks/hw_collectives.ipynb): the pipelined ring.

The exercise is the two marked loops of ``needle/parallel/comm/algorithms/ring.py``
(``ring_reduce_scatter`` and ``ring_gather``); these tests run them on the virtual cluster
against the pure reference, bit for bit.
"""
import numpy as np
import pytest

from needle.parallel import virtual
from needle.parallel.comm.algorithms import reference
from needle.parallel.comm.algorithms.ring import ring_allreduce_naive
from needle.parallel.comm.engine.communicator import Communicator
from needle.parallel.comm.progress import Channel, drive

pytestmark = pytest.mark.collectives


def _ring(comm, xs, chunk_bytes, what):
    c = Communicator(comm.transport, chunk_bytes=chunk_bytes)
    x = xs[comm.rank]
    if what == "allreduce":
        return c.allreduce(x, algorithm="ring")
    if what == "reduce_scatter":  # the ring by name: "auto" may pick recursive halving
        return c.reduce_scatter(x, algorithm="ring")
    return c.allgather(x, algorithm="ring")


def inputs(p: int, n: int, seed: int) -> list:
    return [(np.random.default_rng([seed, q]).random(n) * 100).astype(np.float32)
            for q in range(p)]


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("chunk", [4, 12, 1 << 20])
@pytest.mark.parametrize("n", [0, 1, 7, 40])
def test_ring_allreduce_equals_the_reference(p: int, chunk: int, n: int) -> None:
    xs = inputs(p, n, p * 100 + n)
    expect = reference.ring_allreduce(xs)
    for r, got in enumerate(virtual.run(p, _ring, xs, chunk, "allreduce")):
        assert got.tobytes() == expect[r].tobytes() and got.shape == expect[r].shape


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("chunk", [4, 1 << 20])
def test_ring_reduce_scatter_and_allgather_equal_the_references(p: int, chunk: int) -> None:
    xs = inputs(p, 23, p)
    for r, got in enumerate(virtual.run(p, _ring, xs, chunk, "reduce_scatter")):
        assert got.tobytes() == reference.ring_reduce_scatter(xs)[r].tobytes()
    for r, got in enumerate(virtual.run(p, _ring, xs, chunk, "allgather")):
        assert got.tobytes() == reference.ring_allgather(xs)[r].tobytes()


def _bytes_sent(comm, n):
    comm.allreduce(np.ones(n, np.float32), algorithm="ring")
    return comm.ledger.records[-1].bytes_sent


@pytest.mark.parametrize("p", [2, 4])
def test_ring_sends_2_p_minus_1_over_p_n(p: int) -> None:
    n = 1200
    assert virtual.run(p, _bytes_sent, n) == [2 * (p - 1) * n * 4 // p] * p


def _naive(comm, xs):
    gen = ring_allreduce_naive(Channel(comm.transport, 1000), xs[comm.rank])
    return drive(gen, comm.transport, 20, lambda: "ring_allreduce_naive timed out")


@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [0, 3, 41])
def test_naive_ring_allreduce_equals_the_reference(p: int, n: int) -> None:
    xs = inputs(p, n, p * 10 + n)
    expect = reference.ring_allreduce(xs)
    for r, got in enumerate(virtual.run(p, _naive, xs)):
        assert got.tobytes() == expect[r].tobytes()

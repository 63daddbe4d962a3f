"""Hierarchical allreduce: the pure function against numpy, the point-to-point version against
the pure one bit for bit (virtual cluster, hosts given by ``comm.nodes``), the bytes it puts on
the host links against the flat ring's, and its automatic selection."""
import numpy as np
import pytest

from needle.parallel import virtual
from needle.parallel.comm.algorithms.hierarchical import (
    hierarchical_allreduce_reference,
    host_groups,
    worthwhile,
)
from needle.parallel.comm.engine.communicator import Communicator

LAYOUTS = [[0, 0, 1, 1], [0, 0, 0, 1, 1, 1], ["a", "b", "a", "b"], [0, 0, 1, 1, 2, 2],
           [0, 1, 2], [7, 7, 7]]


def _inputs(p, n, dtype):
    rng = np.random.default_rng(p * 1000 + n)
    if np.issubdtype(dtype, np.integer):
        return [rng.integers(-50, 50, n).astype(dtype) for _ in range(p)]
    return [rng.standard_normal(n).astype(dtype) for _ in range(p)]


@pytest.mark.parametrize("nodes", LAYOUTS)
@pytest.mark.parametrize("op", ["sum", "max", "avg"])
@pytest.mark.parametrize("n", [1, 7, 30])
def test_reference_equals_numpy(nodes, op, n):
    for dtype in (np.int64, np.float64):
        if op == "avg" and dtype == np.int64:
            continue
        xs = _inputs(len(nodes), n, dtype)
        want = {"sum": np.sum, "max": np.max, "avg": np.mean}[op](np.stack(xs), axis=0)
        for got in hierarchical_allreduce_reference(xs, nodes, op):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
            assert got.dtype == dtype


def _hier(comm, xs, nodes, op, chunk, algorithm):
    c = Communicator(comm.transport, chunk_bytes=chunk)
    c.nodes = nodes
    out = c.allreduce(xs[comm.rank], op=op, algorithm=algorithm)
    return out, [r.algorithm for r in c.ledger if r.name == "allreduce"]


@pytest.mark.parametrize("nodes", LAYOUTS)
@pytest.mark.parametrize("chunk", [64, 1 << 20])
def test_point_to_point_equals_reference_bit_for_bit(nodes, chunk):
    p = len(nodes)
    xs = [x.reshape(101, 3) for x in _inputs(p, 303, np.float64)]
    want = hierarchical_allreduce_reference(xs, nodes, "sum")
    for r, (got, algos) in enumerate(virtual.run(p, _hier, xs, nodes, "sum", chunk,
                                                 "hierarchical")):
        assert algos == ["hierarchical"]
        np.testing.assert_array_equal(got, want[r])
    # and it is not the flat ring's result bit for bit (a different order of additions)
    flat = virtual.run(p, _hier, xs, nodes, "sum", chunk, "ring")
    if worthwhile(nodes):
        assert any(not np.array_equal(f[0], w) for f, w in zip(flat, want))


@pytest.mark.parametrize("nodes, expect", [
    ([0, 0, 1, 1], "hierarchical"), ([0, 0, 0, 0], "ring"), ([0, 1, 2, 3], "ring"),
    ([0, 0, 0, 1], "ring")])
def test_chosen_automatically_for_large_messages_when_ranks_share_hosts(nodes, expect):
    big = [np.ones(1 << 15) * r for r in range(4)]  # 256 KiB: above the latency-bound size
    small = [np.ones(8) * r for r in range(4)]
    for got, algos in virtual.run(4, _hier, big, nodes, "sum", 1 << 20, "auto"):
        assert algos == [expect] and got[0] == 6
    for _, algos in virtual.run(4, _hier, small, nodes, "sum", 1 << 20, "auto"):
        assert algos == ["recursive_doubling"]


def _ring_or_hier(comm, n, algorithm):
    c = Communicator(comm.transport, chunk_bytes=1 << 30)
    c.nodes = [0, 0, 1, 1]
    c.allreduce(np.ones(n), algorithm=algorithm)


@pytest.mark.parametrize("algorithm, per_link", [("ring", 1.5), ("hierarchical", 1.0)])
def test_bytes_on_the_host_link(algorithm, per_link):
    """2 hosts x 2 ranks, N bytes: the flat ring puts 2 (p-1)/p N = 1.5 N on the link in each
    direction, the hierarchical one 2 (H-1)/H N = N (the source of its speedup)."""
    n = 1 << 12
    cluster = virtual.Cluster(4, trace=True)
    cluster.run(_ring_or_hier, n, algorithm)
    host = [0, 0, 1, 1]
    payload = [m for m in cluster.trace if m.nbytes > 16]
    for h in (0, 1):
        out = sum(m.nbytes for m in payload if host[m.src] == h and host[m.dst] != h)
        assert out == per_link * 8 * n


def test_unequal_hosts_are_refused_by_name():
    with pytest.raises(ValueError, match=r"same number of ranks on every host, got \[3, 1\]"):
        host_groups([0, 0, 0, 1])
    with pytest.raises(virtual.RankFailedError, match=r"ValueError: hierarchical allreduce"):
        virtual.run(4, _hier, [np.ones(1 << 15)] * 4, [0, 0, 0, 1], "sum", 1 << 20,
                    "hierarchical")


def _hier_async(comm, xs, nodes, op):
    c = Communicator(comm.transport, chunk_bytes=256)
    c.nodes = nodes
    work = c.allreduce_async(xs[comm.rank], op=op, algorithm="hierarchical")
    while not work.test():  # progress by polling, as DDP does between buckets
        pass
    return work.wait()


@pytest.mark.parametrize("op, dtype", [("avg", np.float64), ("max", np.int64),
                                       ("sum", np.float32)])
def test_async_and_other_ops_equal_reference(op, dtype):
    nodes = [0, 0, 1, 1, 2, 2]
    xs = _inputs(6, 1000, dtype)
    want = hierarchical_allreduce_reference(xs, nodes, op)
    for r, got in enumerate(virtual.run(6, _hier_async, xs, nodes, op)):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want[r])

"""The pure-function references of needle.parallel.comm.algorithms.reference, checked exactly
against numpy."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from needle.parallel.comm.algorithms import reference as ring

OPS = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


def per_rank(p: int, shape: tuple, dtype: str, seed: int) -> list:
    """Small-integer-valued inputs, so every summation order gives the same float result."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-4, 5, size=shape).astype(dtype) for _ in range(p)]


def test_chunk_bounds_like_array_split() -> None:
    for n in range(0, 20):
        for p in range(1, 9):
            b = ring.chunk_bounds(n, p)
            sizes = [len(c) for c in np.array_split(np.arange(n), p)]
            assert np.diff(b).tolist() == sizes and b[0] == 0 and b[-1] == n


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 8), n=st.integers(0, 40), op=st.sampled_from(sorted(OPS)),
       dtype=st.sampled_from(["float32", "float64", "int32", "int64"]), seed=st.integers(0, 9))
def test_allreduce_references(p: int, n: int, op: str, dtype: str, seed: int) -> None:
    xs = per_rank(p, (n,), dtype, seed)
    expect = OPS[op](np.stack(xs), axis=0).astype(dtype)
    for fn in (ring.ring_allreduce, ring.recursive_doubling_allreduce):
        outs = fn(xs, op)
        assert len(outs) == p
        for out in outs:
            np.testing.assert_array_equal(out, expect)
            assert out.dtype == np.dtype(dtype)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 8), n=st.integers(0, 30), cols=st.integers(1, 3),
       op=st.sampled_from(["sum", "max", "avg"]), seed=st.integers(0, 9))
def test_reduce_scatter_reference(p: int, n: int, cols: int, op: str, seed: int) -> None:
    xs = per_rank(p, (n, cols), "float64", seed)
    total = np.sum(np.stack(xs), axis=0) if op != "max" else np.max(np.stack(xs), axis=0)
    total = total / p if op == "avg" else total
    chunks = np.array_split(total, p, axis=0)
    for r, out in enumerate(ring.ring_reduce_scatter(xs, op)):
        np.testing.assert_array_equal(out, chunks[r])
    if p & (p - 1) == 0:  # recursive halving: powers of two only
        for r, out in enumerate(ring.recursive_halving_reduce_scatter(xs, op)):
            np.testing.assert_array_equal(out, chunks[r])
            assert out.shape == chunks[r].shape


def test_recursive_halving_pairs_ranks_by_distance() -> None:
    """Rank r's sum is ((x_r + x_{r^2}) + (x_{r^1} + x_{r^3})) at p = 4: seen in float32,
    where 1e8 + 1 rounds away but 1 + 1 does not."""
    xs = [np.full(4, v, np.float32) for v in (1e8, 1.0, -1e8, 1.0)]
    got = ring.recursive_halving_reduce_scatter(xs, "sum")
    # rank 0: (1e8 + -1e8) + (1 + 1) = 2; rank 1: (1 + 1) + (1e8 + -1e8) = 2
    assert [float(g[0]) for g in got] == [2.0, 2.0, 2.0, 2.0]
    assert float(ring.ring_reduce_scatter(xs, "sum")[0][0]) != 2.0  # another order rounds


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 8), n=st.integers(0, 10), seed=st.integers(0, 9))
def test_allgather_and_alltoall_references(p: int, n: int, seed: int) -> None:
    xs = per_rank(p, (n, 2), "int64", seed)
    for out in ring.ring_allgather(xs):
        np.testing.assert_array_equal(out.reshape(p * n, 2), np.concatenate(xs))
    outs = ring.pairwise_alltoall(xs)
    for r in range(p):
        expect = np.concatenate([np.array_split(x, p)[r] for x in xs])
        np.testing.assert_array_equal(outs[r], expect)


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("root", [0, -1])
def test_binomial_reduce_reference(p: int, root: int) -> None:
    xs = per_rank(p, (6,), "int64", p)
    np.testing.assert_array_equal(ring.binomial_reduce(xs, root % p, "sum"), np.sum(xs, axis=0))


def test_ring_segments_circulate_in_ring_order() -> None:
    """Segment i of the ring sum starts on rank i and picks up ranks i+1, i+2, ... in order."""
    xs = [np.array([1e16, 1.0, -1e16], dtype=np.float64) for _ in range(3)]
    xs[1] = np.array([1.0, -1e16, 1e16])
    xs[2] = np.array([-1e16, 1e16, 1.0])
    # Each segment's additions happen in ring order, so the rounding is predictable.
    out = ring.ring_allreduce(xs)[0]
    assert out.tolist() == [(xs[0][0] + xs[1][0]) + xs[2][0], (xs[1][1] + xs[2][1]) + xs[0][1],
                            (xs[2][2] + xs[0][2]) + xs[1][2]] == [0.0, 1.0, 0.0]


def test_avg_rules() -> None:
    xs = [np.array([1, 2], dtype=np.int32), np.array([2, 2], dtype=np.int32)]
    assert ring.ring_allreduce(xs, "avg")[0].tolist() == [1, 2]  # floor division
    with pytest.raises(ValueError, match="bool"):
        ring.ring_allreduce([np.array([True])] * 2, "avg")

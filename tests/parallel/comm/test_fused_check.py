"""The argument check carried inside the data messages: recursive-doubling allgather
and allreduce and recursive-halving reduce-scatter send no message but their own, and still
raise on every rank on a mismatch."""
import numpy as np
import pytest
from mpi_helpers import BACKENDS, run_ranks

from needle.parallel import virtual
from needle.parallel.comm.algorithms import reference, select


def _gather(comm, shape, dtype, algorithm):
    x = (np.arange(int(np.prod(shape))) * 3 + 1000 * comm.rank).astype(dtype).reshape(shape)
    blocking = comm.allgather(x, algorithm=algorithm)
    pending = comm.allgather_async(x, algorithm=algorithm)
    again = comm.allgather(x, algorithm=algorithm)  # the cached buffers, reused
    return blocking, pending.wait(), again, comm.ledger.records[-1].algorithm


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("shape,dtype", [((0,), "float32"), ((1,), "int8"), ((5,), "float64"),
                                         ((3, 2), "int32"), ((7, 3), "float16")])
def test_recursive_doubling_allgather_equals_concatenation(p, shape, dtype) -> None:
    algorithm = "recursive_doubling" if p > 1 else "auto"
    for got in virtual.run(p, _gather, shape, dtype, algorithm):
        expect = np.concatenate([(np.arange(int(np.prod(shape))) * 3 + 1000 * q)
                                 .astype(dtype).reshape(shape) for q in range(p)])
        for arr in got[:3]:
            assert arr.shape == expect.shape and arr.tobytes() == expect.tobytes()
        if p > 1:
            assert got[3] == "recursive_doubling"


def _scatter(comm, xs, op, algorithm):
    blocking = comm.reduce_scatter(xs[comm.rank], op=op, algorithm=algorithm)
    pending = comm.reduce_scatter_async(xs[comm.rank], op=op, algorithm=algorithm).wait()
    return blocking, pending, comm.ledger.records[-1].algorithm


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("shape", [(0,), (1,), (13, 3), (300,)])
@pytest.mark.parametrize("op,dtype", [("sum", "float32"), ("max", "int64"), ("avg", "float64"),
                                      ("prod", "float32")])
def test_recursive_halving_reduce_scatter_equals_the_reference(p, shape, op, dtype) -> None:
    xs = [(np.random.default_rng([p, q]).random(shape) * 10).astype(dtype) for q in range(p)]
    expect = reference.recursive_halving_reduce_scatter(xs, op)
    for r, (blocking, pending, algo) in enumerate(virtual.run(p, _scatter, xs, op,
                                                              "recursive_halving")):
        assert blocking.shape == expect[r].shape and algo == "recursive_halving"
        assert blocking.tobytes() == expect[r].tobytes() == pending.tobytes()
    if p == 2:  # one exchange: the same sums as the ring
        ring = reference.ring_reduce_scatter(xs, op)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(expect, ring))


def _messages(p, fn):
    cluster = virtual.Cluster(p, trace=True)
    cluster.run(fn)
    return [(m.src, m.nbytes) for m in cluster.trace]


def _small_allgather(comm):
    comm.allgather(np.ones(10, np.float32))


def _small_allreduce(comm):
    comm.allreduce(np.ones(10, np.float32))


@pytest.mark.parametrize("p", [2, 4, 8])
def test_the_check_rides_in_the_data_messages(p) -> None:
    """log2 p messages per rank and no other; each carries 16 header bytes."""
    log2p = p.bit_length() - 1
    sent = _messages(p, _small_allgather)
    assert len(sent) == p * log2p
    for r in range(p):  # step k: 2^k parts of 40 bytes, then the header
        assert sorted(n for src, n in sent if src == r) == [40 * (1 << k) + 16
                                                            for k in range(log2p)]
    sent = _messages(p, _small_allreduce)
    assert len(sent) == p * log2p and {n for _, n in sent} == {40 + 16}
    sent = _messages(p, _small_reduce_scatter)  # halves of 80 * p bytes: 40p, 20p, ... 80
    assert sorted(n for src, n in sent if src == 0) == [80 * (1 << k) + 16
                                                        for k in range(log2p)]
    assert len(sent) == p * log2p


def _small_reduce_scatter(comm):
    comm.reduce_scatter(np.ones(20 * comm.size, np.float32))


def _mismatch(comm, mode):
    last = comm.rank == comm.size - 1
    try:
        if mode == "shape":
            comm.allgather(np.ones((3, 2) if last else (2, 3)))
        elif mode == "size":
            comm.allgather(np.ones(5 if last else 4))
        elif mode == "dtype":
            comm.allgather(np.ones(4, np.int64 if last else np.float64))
        elif mode == "large":  # messages past MPI's eager limit: a truncated large receive
            comm.allgather(np.ones(20000 if last else 10000), algorithm="recursive_doubling")
        elif mode == "scatter_op":
            comm.reduce_scatter(np.ones(8), op="max" if last else "sum")
        elif mode == "scatter_size":  # 12 rows split 3, 3, 3, 3 against 16 split 4, 4, 4, 4
            comm.reduce_scatter(np.ones(16 if last else 12))
        else:  # the other ranks run the ring with the check beside it
            comm.allgather(np.ones(4), algorithm="recursive_doubling" if last else "ring")
    except ValueError as err:
        return str(err)
    return "finished without error"


@pytest.mark.parametrize("mode", ["shape", "size", "dtype", "algorithm", "large",
                                  "scatter_op", "scatter_size"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_mismatch_raises_on_every_rank(backend, mode) -> None:
    messages = run_ranks(backend, 4, _mismatch, mode, timeout=60,
                         env={"NEEDLE_COMM_TIMEOUT": "20"})
    name = "reduce_scatter" if mode.startswith("scatter") else "allgather"
    for r, msg in enumerate(messages):
        assert msg.startswith("needle.parallel: ranks called a collective with different "
                              f"arguments (seen from rank {r})"), msg
        assert f"ranks [3]: {name}" in msg and f"ranks [0, 1, 2]: {name}" in msg, msg


def test_auto_choice_and_bad_algorithm() -> None:
    assert select.choose("allgather", 1024, 4) == "recursive_doubling"
    assert select.choose("allgather", 1024, 3) == "ring"
    assert select.choose("allgather", select.ALLGATHER_SMALL + 1, 4) == "ring"
    assert select.choose("reduce_scatter", 1024, 2) == "recursive_halving"
    assert select.choose("reduce_scatter", select.REDUCE_SCATTER_SMALL + 1, 2) == "ring"
    assert select.choose("reduce_scatter", 1024, 6) == "ring"
    with pytest.raises(ValueError, match="power-of-two number of ranks, not 3"):
        select.choose("allgather", 1024, 3, "recursive_doubling")
    with pytest.raises(ValueError, match="recursive_halving needs a power-of-two"):
        select.choose("reduce_scatter", 1024, 6, "recursive_halving")


def _contexts(comm, algorithm, n, blocking):
    """Rank 0 passes context 7, the others 2 (+ rank); the error's contexts and message."""
    x = np.ones(n, np.float32)
    context = 7 if comm.rank == 0 else 2 + comm.rank
    try:
        if blocking:
            comm.allreduce(x, algorithm=algorithm, context=context)
        else:
            comm.allreduce_async(x, algorithm=algorithm, context=context).wait()
    except ValueError as err:
        return getattr(err, "contexts", None), str(err)
    return None, "finished without error"


@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize("algorithm,n", [("auto", 10), ("ring", 10), ("auto", 40000)])
def test_allreduce_contexts_that_differ_raise_naming_each(algorithm, n, blocking) -> None:
    """The context is checked with the arguments (fused path, ring beside the check)."""
    for r, (contexts, msg) in enumerate(virtual.run(3, _contexts, algorithm, n, blocking,
                                                    timeout=20)):
        assert contexts == [7, 3, 4], (r, msg)
        assert f"(seen from rank {r})" in msg and "ranks [0]: allreduce" in msg, msg
        assert "context=7" in msg and "context=3" in msg and "context=4" in msg, msg


def _same_context(comm, context):
    comm.allreduce(np.ones(10, np.float32), context=context)
    comm.allreduce(np.ones(10, np.float32), context=context)  # the cached fused call again
    comm.allreduce(np.ones(40000, np.float32), context=context)
    records = [(r.algorithm, r.bytes_sent, r.bytes_recv, r.messages) for r in comm.ledger.records]
    return records, comm.stats  # stats: the check's header bytes too


def test_an_agreeing_context_costs_no_message_or_byte() -> None:
    for with_ctx, without in zip(virtual.run(2, _same_context, 5),
                                 virtual.run(2, _same_context, 0)):
        assert with_ctx == without and len(with_ctx[0]) == 3
        assert [r[0] for r in with_ctx[0]] == ["recursive_doubling"] * 2 + ["ring"]

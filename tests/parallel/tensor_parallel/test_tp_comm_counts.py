"""Megatron's communication count: 2 allreduces forward + 2 backward per transformer layer;
sequence parallelism: all-gathers and reduce-scatters carrying the same bytes; the vocab-parallel
cross-entropy: 3 small allreduces, never a full-vocabulary gather."""
import numpy as np
import pytest
from mpi_helpers import BACKENDS, run_ranks

import needle as ndl
from needle.parallel.tensor_parallel import (
    ParallelTransformerBlock,
    gathered_cross_entropy,
    vocab_parallel_cross_entropy,
)

B, T, D, NH, DH, H = 2, 8, 16, 4, 4, 32


def backends():
    """Virtual and MPI once the virtual cluster exists; MPI alone until then."""
    try:
        import needle.parallel.virtual  # noqa: F401
    except ImportError:
        return [pytest.param("mpi", marks=pytest.mark.mpi)]
    return BACKENDS


def _counts(comm, region):
    """{collective: (calls, payload bytes sent)} of the ledger's records inside ``region``."""
    out = {}
    for rec in comm.ledger.records:
        if rec.label and rec.label.split("/")[0] == region:
            calls, sent = out.get(rec.name, (0, 0))
            out[rec.name] = (calls + 1, sent + rec.bytes_sent)
    return out


def _labels(comm, region):
    return sorted(rec.label for rec in comm.ledger.records
                  if rec.label and rec.label.split("/")[0] == region)


def block_counts(comm, sp, recompute=False):
    """Per-collective (calls, bytes sent) of one layer's forward and of its backward."""
    np.random.seed(0)
    block = ParallelTransformerBlock(D, NH, DH, H, comm, sequence_parallel=sp,
                                     recompute_gather=recompute, dtype="float64")
    x = np.random.RandomState(1).randn(B, T, D)
    if sp:
        x = np.split(x, comm.size, axis=1)[comm.rank]                # (B, T/p, D)
    x = ndl.Tensor(x, dtype="float64")
    comm.ledger.reset()
    with comm.region("forward"):
        out = block(x)
    with comm.region("backward"):
        (out * out).sum().backward()
    return _counts(comm, "forward"), _counts(comm, "backward")


def block_labels(comm):
    np.random.seed(0)
    block = ParallelTransformerBlock(D, NH, DH, H, comm, dtype="float64")
    x = ndl.Tensor(np.random.RandomState(1).randn(B, T, D), dtype="float64")
    with comm.region("forward"):
        out = block(x)
    with comm.region("backward"):
        out.sum().backward()
    return _labels(comm, "forward") + _labels(comm, "backward"), comm.ledger.summary()


@pytest.mark.parametrize("backend", backends())
def test_ledger_names_megatron_f_and_g(backend):
    for labels, summary in run_ranks(backend, 2, block_labels, timeout=60):
        assert labels == ["forward/tp.g"] * 2 + ["backward/tp.f.backward"] * 2
        assert "tp.g" in summary


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("tp", [2, 4])
def test_megatron_two_allreduces_each_way(backend, tp):
    for fwd, bwd in run_ranks(backend, tp, block_counts, False, timeout=120):
        assert {k: v[0] for k, v in fwd.items()} == {"allreduce": 2}
        assert {k: v[0] for k, v in bwd.items()} == {"allreduce": 2}


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_same_bytes_as_ring_allreduce(backend, tp):
    # Without SP the layer allreduces (B,T,D) twice forward, (3,B,T,D) [needle's attention has
    # three pre-norms, q/k/v, whose outputs share one f] and (B,T,D) backward: 6 BTD numbers;
    # a ring allreduce of N bytes sends 2 (p-1)/p N per rank. With SP the 3-wide all-gather moves
    # to the forward (and its reduce-scatter to the backward), so only the step's total matches.
    unit = B * T * D * 8
    ring_total = 2 * (tp - 1) * 6 * unit // tp
    for fwd, bwd in run_ranks(backend, tp, block_counts, True, timeout=120):
        assert {k: v[0] for k, v in fwd.items()} == {"allgather": 2, "reduce_scatter": 2}
        assert {k: v[0] for k, v in bwd.items()} == {"allgather": 2, "reduce_scatter": 2}
        assert sum(v[1] for v in fwd.values()) + sum(v[1] for v in bwd.values()) == ring_total


@pytest.mark.parametrize("backend", backends())
def test_recomputed_gather_adds_two_all_gathers_to_backward(backend):
    # Korthikanti sec. 4.2.2: keep only the shard, all-gather again in backward
    for fwd, bwd in run_ranks(backend, 2, block_counts, True, True, timeout=120):
        assert {k: v[0] for k, v in fwd.items()} == {"allgather": 2, "reduce_scatter": 2}
        assert {k: v[0] for k, v in bwd.items()} == {"allgather": 4, "reduce_scatter": 2}


def ring_allreduce_bytes(comm):
    """Bytes one ring-allreduced non-SP layer sends (NEEDLE_ALLREDUCE_SMALL=0 forces the ring)."""
    fwd, bwd = block_counts(comm, False)
    return fwd["allreduce"][1], bwd["allreduce"][1]


@pytest.mark.mpi
def test_sequence_parallel_bytes_equal_measured_ring_allreduce():
    tp = 2
    res = run_ranks("mpi", tp, ring_allreduce_bytes, timeout=120,
                    env={"NEEDLE_ALLREDUCE_SMALL": "0"})
    sp = run_ranks("mpi", tp, block_counts, True, timeout=120)
    for (ar_fwd, ar_bwd), (fwd, bwd) in zip(res, sp):
        sp_bytes = sum(v[1] for v in fwd.values()) + sum(v[1] for v in bwd.values())
        assert sp_bytes == ar_fwd + ar_bwd


def ce_counts(comm):
    """Collectives of one vocab-parallel cross-entropy, forward and backward."""
    rng = np.random.RandomState(0)
    n, v = 5, 8 * comm.size
    logits = rng.randn(n, v)[:, comm.rank * 8:(comm.rank + 1) * 8]
    z = ndl.Tensor(logits, dtype="float64")
    with comm.region("forward"):
        loss = vocab_parallel_cross_entropy(z, rng.randint(0, v, size=n), comm)
    with comm.region("backward"):
        loss.backward()
    return (_counts(comm, "forward"), _counts(comm, "backward"), float(loss.numpy()),
            _labels(comm, "forward"))


@pytest.mark.parametrize("backend", backends())
def test_vocab_parallel_cross_entropy_three_small_allreduces(backend):
    tp, n = 2, 5
    for fwd, bwd, _, labels in run_ranks(backend, tp, ce_counts, timeout=120):
        assert {k: v[0] for k, v in fwd.items()} == {"allreduce": 3}
        assert labels == ["forward/ce.max", "forward/ce.sum_exp", "forward/ce.target_logit"]
        assert bwd == {}
        # each allreduce carries n numbers (recursive doubling: log2(p) rounds of n * 8 bytes)
        assert fwd["allreduce"][1] == 3 * n * 8 * int(np.log2(tp))


def ce_both(comm):
    """Loss and logit gradient of the naive (gathered) and the vocab-parallel cross-entropy."""
    rng = np.random.RandomState(0)
    n, v = 5, 8 * comm.size
    logits = rng.randn(n, v)[:, comm.rank * 8:(comm.rank + 1) * 8]
    y = rng.randint(0, v, size=n)
    out = []
    for fn in (gathered_cross_entropy, vocab_parallel_cross_entropy):
        z = ndl.Tensor(logits, dtype="float64")
        comm.ledger.reset()
        loss = fn(z, y, comm)
        loss.backward()
        out.append((float(loss.numpy()), z.grad.numpy(),
                    [(r.name, r.bytes_recv) for r in comm.ledger.records]))
    return out


@pytest.mark.parametrize("backend", backends())
def test_naive_gathered_loss_agrees_but_moves_the_vocabulary(backend):
    tp, n = 4, 5
    for naive, parallel in run_ranks(backend, tp, ce_both, timeout=60):
        assert abs(naive[0] - parallel[0]) < 1e-12
        np.testing.assert_allclose(naive[1], parallel[1], atol=1e-12)
        # naive: one all-gather receiving the other ranks' (n, V/p) logits, after a tiny one
        # of two int64 per rank (targets' CRC-32, shard width) checking that the ranks agree
        assert naive[2] == [("allgather", (tp - 1) * 2 * 8), ("allgather", (tp - 1) * n * 8 * 8)]
        assert [name for name, _ in parallel[2]] == ["allreduce"] * 3

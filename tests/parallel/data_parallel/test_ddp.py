"""DataParallelNaive and DistributedDataParallel equal single-process training on the whole batch.

N ranks seeded differently (the broadcast must make them agree) train on their slices of a
fixed batch; after every one of 5 SGD / Adam steps their parameters equal one process's trained
on the whole batch (float64, 1e-6). Frozen and tied parameters, 1 / 2 / many buckets, no_sync,
overlap (a bucket's allreduce starts before backward ends) and bad input.
"""
import numpy as np
import pytest
from dp_helpers import (
    OPTIMIZERS,
    SEED,
    assert_histories_equal,
    backends,
    backward_that_raises,
    build,
    fast_backend,
    local_slice,
    loss_of,
    reference,
    snapshot,
    virtual_only,
)
from mpi_helpers import run_ranks

import needle as ndl
from needle.parallel import DataParallelNaive, DistributedDataParallel
from needle.parallel.data_parallel import assign_buckets

WRAPPERS = {
    "naive": lambda m, comm: DataParallelNaive(m, comm),
    "ddp": lambda m, comm: DistributedDataParallel(m, comm),  # one bucket
    "ddp2": lambda m, comm: DistributedDataParallel(m, comm, bucket_cap_mb=300 / 2 ** 20,
                                                    first_bucket_mb=300 / 2 ** 20),
    "ddp_many": lambda m, comm: DistributedDataParallel(m, comm, bucket_cap_mb=1e-6,
                                                        first_bucket_mb=1e-6),
    "ddp_no_overlap": lambda m, comm: DistributedDataParallel(m, comm, overlap=False),
}


def train(comm, wrapper, model_name, opt_name, steps=5):
    """This rank's parameters after each step, and the number of buckets."""
    model = build(model_name, SEED + comm.rank)  # different on every rank
    ddp = WRAPPERS[wrapper](model, comm)
    opt = OPTIMIZERS[opt_name](ddp.parameters())
    history = []
    for step in range(steps):
        loss = loss_of(ddp, *local_slice(comm.rank, comm.size, step))
        opt.reset_grad()
        loss.backward()
        opt.step()
        history.append(snapshot(model))
    return history, len(getattr(ddp, "buckets", []))


@pytest.mark.parametrize("backend", virtual_only())
@pytest.mark.parametrize("wrapper", list(WRAPPERS))
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_equals_single_process_every_step(backend, wrapper, opt_name, ranks):
    want = reference("mlp", opt_name)
    for history, _ in run_ranks(backend, ranks, train, wrapper, "mlp", opt_name):
        assert_histories_equal(history, want)


@pytest.mark.parametrize("backend", virtual_only())
@pytest.mark.parametrize("wrapper", ["naive", "ddp", "ddp_many"])
def test_frozen_tied_and_unused_parameters(backend, wrapper):
    want = reference("tied", "adam")
    for history, _ in run_ranks(backend, 2, train, wrapper, "tied", "adam"):
        assert_histories_equal(history, want)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_ddp_under_mpiexec(ranks):
    want = reference("mlp", "adam")
    for history, _ in run_ranks("mpi", ranks, train, "ddp2", "mlp", "adam"):
        assert_histories_equal(history, want)


@pytest.mark.parametrize("wrapper, expected", [("ddp", 1), ("ddp2", 2), ("ddp_many", 6)])
def test_bucket_caps_force_one_two_and_many_buckets(wrapper, expected):
    (_, n1), (_, n2) = run_ranks(fast_backend(), 2, train, wrapper, "mlp", "sgd", 1)
    assert n1 == n2 == expected  # 6 parameters: 3 weights and 3 biases


def test_assign_buckets_reverse_order_dtype_and_caps():
    sizes = [100, 10, 100, 10, 100, 10]
    # Reverse order; a bucket closes once it holds >= its cap (15 bytes first, then 150).
    assert assign_buckets(sizes, ["f"] * 6, 150, 15) == [[5, 4], [3, 2, 1, 0]]
    assert assign_buckets(sizes, ["f"] * 6, 100, 15) == [[5, 4], [3, 2], [1, 0]]
    assert assign_buckets(sizes, ["f"] * 6, 1e9) == [[5, 4, 3, 2, 1, 0]]
    assert assign_buckets(sizes, ["a", "b"] * 3, 1e9) == [[5, 3, 1], [4, 2, 0]]
    assert assign_buckets([5] * 4, ["f"] * 4, 1) == [[3], [2], [1], [0]]
    with pytest.raises(ValueError, match="bucket caps must be > 0"):
        assign_buckets(sizes, ["f"] * 6, 0)


def partial_usage(comm):
    """Rank 0 uses the extra layer, rank 1 does not: its gradient is averaged with zeros."""
    model = build("mlp", SEED + comm.rank)
    extra = ndl.nn.Linear(3, 3, dtype="float64")
    holder = ndl.nn.Sequential(model, extra)
    DistributedDataParallel(holder, comm)
    x, y = local_slice(comm.rank, comm.size)
    out = model(x)
    if comm.rank == 0:
        out = extra(out)
    ndl.nn.SoftmaxLoss()(out, y).backward()
    return [None if p.grad is None else p.grad.numpy() for p in holder.parameters()], \
        holder.state_dict()


def test_parameter_used_on_one_rank_only():
    (g0, s0), (g1, _) = run_ranks(fast_backend(), 2, partial_usage)
    # Reference: each rank's slice on its own, with rank 0's weights, then averaged.
    grads = []
    for r in range(2):
        model = build("mlp", 0)
        extra = ndl.nn.Linear(3, 3, dtype="float64")
        holder = ndl.nn.Sequential(model, extra)
        holder.load_state_dict(s0)
        x, y = local_slice(r, 2)
        out = extra(model(x)) if r == 0 else model(x)
        ndl.nn.SoftmaxLoss()(out, y).backward()
        grads.append([np.zeros(p.shape) if p.grad is None else p.grad.numpy()
                      for p in holder.parameters()])
    for a, b, w0, w1 in zip(g0, g1, *grads):
        np.testing.assert_allclose(a, (w0 + w1) / 2, atol=1e-12)
        np.testing.assert_allclose(b, (w0 + w1) / 2, atol=1e-12)


def accumulate(comm):
    """Two micro-batches under no_sync then one synced: grads before and after the sync."""
    model = build("mlp", SEED + comm.rank)
    ddp = DistributedDataParallel(model, comm, bucket_cap_mb=1e-6, first_bucket_mb=1e-6)
    seen = []
    total = None
    for step in range(3):
        x, y = local_slice(comm.rank, comm.size, step)
        if step < 2:
            with ddp.no_sync():
                loss_of(ddp, x, y).backward()
        else:
            loss_of(ddp, x, y).backward()
        grads = [p.grad.numpy().copy() for p in model.parameters()]
        seen.append(grads)
        total = grads if total is None else total
    return seen, model.state_dict()


def test_no_sync_keeps_local_gradients_then_averages_the_accumulated_sum():
    results = run_ranks(fast_backend(), 2, accumulate)
    state = results[0][1]
    local = {}  # local[rank][step]: the gradient of that rank's slice alone
    for r in range(2):
        for step in range(3):
            model = build("mlp", 0)
            model.load_state_dict(state)
            loss_of(model, *local_slice(r, 2, step)).backward()
            local[r, step] = [p.grad.numpy() for p in model.parameters()]
    for r, (seen, _) in enumerate(results):
        for step in range(2):  # inside no_sync: this rank's own gradient, NOT the average
            for got, mine, other in zip(seen[step], local[r, step], local[1 - r, step]):
                np.testing.assert_allclose(got, mine, atol=1e-12)
                assert not np.allclose(got, (mine + other) / 2)
        for i, got in enumerate(seen[2]):  # synced: average over ranks of the 3-step sum
            want = sum(local[q, s][i] for q in range(2) for s in range(3)) / 2
            np.testing.assert_allclose(got, want, atol=1e-12)


def overlap_order(comm):
    """Events: when each bucket's allreduce starts vs when the first layer's grad is ready."""
    model = build("deep", SEED)
    ddp = DistributedDataParallel(model, comm, bucket_cap_mb=1e-6, first_bucket_mb=1e-6)
    events = []
    real = comm.allreduce_async

    def spy(*args, **kwargs):
        events.append("allreduce")
        return real(*args, **kwargs)
    comm.allreduce_async = spy
    first = model.parameters()[0]  # registered first: its gradient is ready last
    first.register_post_accumulate_grad_hook(lambda p: events.append("first layer grad"))
    loss_of(ddp, *local_slice(comm.rank, comm.size)).backward()
    return events, len(ddp.buckets)


def test_buckets_are_launched_during_backward():
    for events, n_buckets in run_ranks(fast_backend(), 2, overlap_order):
        assert events.count("allreduce") == n_buckets
        # All but the last bucket started before backward reached the first layer.
        assert events.index("first layer grad") >= n_buckets - 1


def count_calls(comm, wrapper):
    model = build("deep", SEED)
    ddp = WRAPPERS[wrapper](model, comm)
    comm.reset_stats()
    loss_of(ddp, *local_slice(comm.rank, comm.size)).backward()
    return comm.stats["allreduce"]["calls"], len(model.parameters())


def test_one_allreduce_per_bucket_vs_per_tensor():
    (naive, n_params), _ = run_ranks(fast_backend(), 2, count_calls, "naive")
    (bucketed, _), _ = run_ranks(fast_backend(), 2, count_calls, "ddp")
    assert naive == n_params + 1  # one per gradient, plus one for "who used what"
    assert bucketed == 1


# ------------------------------------------------------------------------------ bad input
def mismatched(comm, wrapper):
    """Rank 1 builds a wider first layer; returns the error message each rank raised."""
    np.random.seed(comm.rank)
    width = 8 if comm.rank == 0 else 9
    model = ndl.nn.Sequential(ndl.nn.Linear(5, width), ndl.nn.ReLU(), ndl.nn.Linear(width, 2))
    try:
        WRAPPERS[wrapper](model, comm)
    except ValueError as err:
        return str(err)
    return None


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("wrapper", ["naive", "ddp"])
def test_different_shapes_on_ranks_raise_on_every_rank(backend, wrapper):
    for r, msg in enumerate(run_ranks(backend, 3, mismatched, wrapper, timeout=60)):
        assert msg is not None, f"rank {r} did not raise"
        assert "parameter 'modules.0.weight' has shape (5, 9) (float32) on rank 1 but (5, 8) " \
               "(float32) on rank 0" in msg and f"seen from rank {r}" in msg


def bad_cap(comm, cap):
    try:
        DistributedDataParallel(build("mlp", 0), comm, bucket_cap_mb=cap)
    except ValueError as err:
        return str(err)


@pytest.mark.parametrize("cap", [0, -1.0])
def test_bucket_cap_must_be_positive(cap):
    for r, msg in enumerate(run_ranks(fast_backend(), 2, bad_cap, cap)):
        assert f"bucket_cap_mb must be > 0, got {cap!r} (rank {r})" in msg


def after_a_failed_backward(comm, wrapper):
    """A backward that raises half way, then a normal one: the grads."""
    ddp = WRAPPERS[wrapper](build("mlp", SEED + comm.rank), comm)
    backward_that_raises(ddp, comm.rank, comm.size)
    for p in ddp.parameters():
        p.grad = None
    loss_of(ddp, *local_slice(comm.rank, comm.size, 1)).backward()
    return [p.grad.numpy().copy() for p in ddp.parameters()]


@pytest.mark.parametrize("wrapper", ["naive", "ddp_many"])
def test_a_backward_that_raised_does_not_stop_the_next_one_from_averaging(wrapper):
    g0, g1 = run_ranks(fast_backend(), 2, after_a_failed_backward, wrapper, timeout=60)
    for a, b in zip(g0, g1):  # the ranks' slices differ: equal grads means they were averaged
        np.testing.assert_allclose(a, b, atol=1e-12)
    assert any(np.abs(a).max() > 0 for a in g0)

"""ZeroRedundancyOptimizer stages 1 and 2 equal DDP and single-process training (float64).

Plus: the shard arithmetic, stage 2 keeps no full gradient and calls no allreduce, memory per
rank follows the ZeRO formulas, and bad optimizer options are clear errors on every rank.
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
)
from mpi_helpers import run_ranks

import needle as ndl
from needle.parallel import DistributedDataParallel, ZeroRedundancyOptimizer
from needle.parallel.zero import owned_pieces


@pytest.mark.parametrize("sizes", [[5], [3, 4, 5], [1] * 7, [10, 1, 1]])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_owned_pieces_partition_every_element_once(sizes, world):
    seen = np.zeros(sum(sizes), dtype=int)
    offsets = np.cumsum([0] + sizes[:-1])
    cols = -(-sum(sizes) // world)
    for rank in range(world):
        for pc in owned_pieces(sizes, world, rank):
            flat = offsets[pc.slot] + pc.start
            seen[flat:flat + pc.length] += 1
            assert flat - rank * cols == pc.at  # position in this rank's shard
    assert (seen == 1).all()


def train(comm, stage, model_name, opt_name, cap=25.0, steps=5):
    """Stage 1 over a DDP model, stage 2 over the plain model; parameters after each step."""
    model = build(model_name, SEED + comm.rank)
    net = DistributedDataParallel(model, comm) if stage == 1 else model
    kwargs = {"adam": dict(lr=0.01, weight_decay=0.01),
              "sgd": dict(lr=0.1, momentum=0.9, weight_decay=0.01)}[opt_name]
    cls = {"adam": ndl.optim.Adam, "sgd": ndl.optim.SGD}[opt_name]
    opt = ZeroRedundancyOptimizer(model.parameters(), cls, comm, stage=stage,
                                  bucket_cap_mb=cap, **kwargs)
    history = []
    for step in range(steps):
        loss = loss_of(net, *local_slice(comm.rank, comm.size, step))
        opt.reset_grad()
        loss.backward()
        opt.step()
        history.append(snapshot(model))
    return history


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("cap", [25.0, 1e-6])  # one bucket / one per parameter
def test_equals_single_process(stage, ranks, opt_name, cap):
    want = reference("mlp", opt_name)
    for history in run_ranks(fast_backend(), ranks, train, stage, "mlp", opt_name, cap):
        assert_histories_equal(history, want)


@pytest.mark.parametrize("stage", [1, 2])
def test_frozen_tied_and_unused_parameters(stage):
    want = reference("tied", "adam")
    for history in run_ranks(fast_backend(), 3, train, stage, "tied", "adam", 1e-6):
        assert_histories_equal(history, want)


def ddp_and_zero(comm, stage):
    """DDP + Adam and ZeRO-`stage` + Adam from the same start: parameters after 5 steps."""
    out = []
    for zero in (False, True):
        model = build("deep", SEED + comm.rank)
        net = DistributedDataParallel(model, comm) if (not zero or stage == 1) else model
        opt = ZeroRedundancyOptimizer(model.parameters(), ndl.optim.Adam, comm, stage=stage,
                                      lr=0.01) if zero else OPTIMIZERS["adam"](model.parameters())
        if zero:
            opt.optimizers[0].weight_decay = 0.01
        for step in range(5):
            loss = loss_of(net, *local_slice(comm.rank, comm.size, step))
            opt.reset_grad()
            loss.backward()
            opt.step()
        out.append(snapshot(model))
    return out


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("stage", [1, 2])
def test_equals_ddp_after_five_adam_steps(backend, stage):
    for ddp, zero in run_ranks(backend, 2, ddp_and_zero, stage):
        assert_histories_equal([zero], [ddp])


def stage2_traffic(comm):
    model = build("deep", SEED + comm.rank)
    opt = ZeroRedundancyOptimizer(model.parameters(), ndl.optim.Adam, comm, stage=2,
                                  bucket_cap_mb=1e-6, lr=0.01)
    comm.reset_stats()
    loss_of(model, *local_slice(comm.rank, comm.size)).backward()
    grads_kept = [p.grad is not None for p in model.parameters()]
    shard_grads = sum(int(np.prod(t.grad.shape)) for o in opt.optimizers for t in o.params
                      if t.grad is not None)
    opt.step()
    calls = {k: v["calls"] for k, v in comm.stats.items() if v["calls"]}
    return grads_kept, shard_grads, opt.shard_numel, calls, len(opt.buckets)


def test_stage2_keeps_only_its_gradient_shard_and_never_allreduces():
    for kept, shard_grads, shard_numel, calls, n_buckets in \
            run_ranks(fast_backend(), 2, stage2_traffic):
        assert not any(kept)  # no full gradient survives backward
        assert shard_grads == shard_numel
        assert "allreduce" not in calls
        assert calls["reduce_scatter"] == calls["allgather"] == n_buckets


def model_state_bytes(comm, stage):
    """Live bytes after a step of a 3-layer float32 MLP (model states dominate)."""
    from needle.memory import MemoryTracker
    with MemoryTracker() as tracker:
        np.random.seed(0)
        model = ndl.nn.Sequential(ndl.nn.Linear(256, 256), ndl.nn.ReLU(),
                                  ndl.nn.Linear(256, 256), ndl.nn.ReLU(), ndl.nn.Linear(256, 8))
        net = DistributedDataParallel(model, comm) if stage == 1 else model
        opt = ZeroRedundancyOptimizer(model.parameters(), ndl.optim.Adam, comm, stage=stage)
        x = ndl.Tensor(np.random.randn(4, 256), requires_grad=False)
        y = ndl.Tensor(np.arange(4) % 8, dtype="int64")
        loss = ndl.nn.SoftmaxLoss()(net(x), y)
        loss.backward()
        opt.step()
        del loss
        live = tracker.current_bytes - 2 * x.realize_cached_data().nbytes
    return live, model.num_parameters()


@pytest.mark.mpi  # one process per rank: a MemoryTracker sees only its own rank
@pytest.mark.parametrize("stage, formula", [(1, lambda n: 8 + 8 / n), (2, lambda n: 4 + 12 / n)])
@pytest.mark.parametrize("ranks", [2, 4])
def test_model_state_bytes_follow_the_zero_formulas(stage, formula, ranks):
    for live, psi in run_ranks("mpi", ranks, model_state_bytes, stage):
        want = formula(ranks) * psi  # fp32 Adam: P = G = 4, K = 8 bytes per parameter
        assert abs(live - want) <= 0.05 * want, (live, want)


# ------------------------------------------------------------------------------ bad input
def bad_options(comm, case):
    model = build("mlp", 0)
    try:
        if case == "group":
            groups = [{"params": model.parameters()[:2], "lr": 0.1},
                      {"params": model.parameters()[2:], "betas": (0.9, 0.99)}]
            ZeroRedundancyOptimizer(groups, ndl.optim.Adam, comm)
        elif case == "default":
            ZeroRedundancyOptimizer(model.parameters(), ndl.optim.SGD, comm, beta1=0.9)
        elif case == "adafactor":
            ZeroRedundancyOptimizer(model.parameters(), ndl.optim.Adafactor, comm)
        elif case == "shapes":
            np.random.seed(comm.rank)
            other = ndl.nn.Linear(5, 4 + comm.rank)
            ZeroRedundancyOptimizer(other.parameters(), ndl.optim.Adam, comm)
    except (ValueError, TypeError) as err:
        return str(err)


@pytest.mark.parametrize("case, pieces", [
    ("group", ["param group 1 sets 'betas'", "Adam does not accept", "beta1"]),
    ("default", ["the defaults sets 'beta1'", "SGD does not accept"]),
    ("adafactor", ["Adafactor does not update elements independently"]),
    ("shapes", ["parameter 'param 0' has shape (5, 5) (float32) on rank 1 but (5, 4)"]),
])
def test_bad_input_is_a_clear_error_on_every_rank(case, pieces):
    for rank, msg in enumerate(run_ranks(fast_backend(), 2, bad_options, case)):
        assert msg is not None
        for piece in pieces:
            assert piece in msg, msg
        if case != "adafactor":
            assert f"rank {rank}" in msg


def step_after_a_failed_backward(comm, fail_first):
    """ZeRO-2: (perhaps) a backward that raises half way, then reset_grad, a normal backward
    and a step: the parameters."""
    model = build("mlp", SEED + comm.rank)
    opt = ZeroRedundancyOptimizer(model.parameters(), ndl.optim.SGD, comm, stage=2,
                                  bucket_cap_mb=1e-6, lr=0.1)
    if fail_first:
        backward_that_raises(model, comm.rank, comm.size)
    opt.reset_grad()
    loss_of(model, *local_slice(comm.rank, comm.size, 1)).backward()
    opt.step()
    return snapshot(model)


def test_stage2_a_backward_that_raised_does_not_spoil_the_next_step():
    """As DDP and FSDP: the next step's gradients are reduced and applied in full."""
    want = run_ranks(fast_backend(), 2, step_after_a_failed_backward, False, timeout=60)
    got = run_ranks(fast_backend(), 2, step_after_a_failed_backward, True, timeout=60)
    for w, g in zip(want, got):
        assert_histories_equal([g], [w])

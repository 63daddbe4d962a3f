"""FullyShardedDataParallel equals single-process training and DDP (float64); checkpoints,
mixed precision, memory (16 Psi / N for fp32 Adam) and bytes sent (1.5x DDP's)."""
import os

import numpy as np
import pytest
from dp_helpers import (
    OPTIMIZERS,
    SEED,
    assert_histories_equal,
    backends,
    build,
    fast_backend,
    local_slice,
    loss_of,
    reference,
    snapshot,
    whole_batch,
)
from mpi_helpers import run_ranks

import needle as ndl
from needle.parallel import DistributedDataParallel, FullyShardedDataParallel


def train(comm, model_name, opt_name, units=None, steps=5):
    """The full state dict after each step."""
    model = build(model_name, SEED + comm.rank)
    chosen = None if units is None else [dict(model.named_modules())[n] for n in units]
    fsdp = FullyShardedDataParallel(model, comm, units=chosen)
    opt = OPTIMIZERS[opt_name](fsdp.parameters())
    history = []
    for step in range(steps):
        loss = loss_of(fsdp, *local_slice(comm.rank, comm.size, step))
        opt.reset_grad()
        loss.backward()
        opt.step()
        history.append(list(fsdp.full_state_dict().values()))
    return history


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("model_name", ["mlp", "deep"])
def test_equals_single_process(ranks, opt_name, model_name):
    want = reference(model_name, opt_name)
    for history in run_ranks(fast_backend(), ranks, train, model_name, opt_name):
        assert_histories_equal(history, want)


@pytest.mark.parametrize("units", [[], ["inp", "mid", "out"], ["inp", "mid", "mid2", "out"]])
def test_frozen_and_tied_parameters(units):
    """Tied weights of two units go to the root; the frozen one stays whole. (The 'unused'
    parameter gets a zero gradient, as in PyTorch's flat parameters: excluded here.)"""
    want = reference("tied", "adam")
    names = list(build("tied", 0).state_dict())
    keep = [i for i, n in enumerate(names) if n != "unused"]
    for history in run_ranks(fast_backend(), 2, train, "tied", "adam", units):
        got = [[step[i] for i in keep] for step in history]
        assert_histories_equal(got, [[step[i] for i in keep] for step in want])


def ddp_vs_fsdp(comm):
    out = []
    for fsdp in (False, True):
        model = build("deep", SEED + comm.rank)
        net = FullyShardedDataParallel(model, comm) if fsdp else \
            DistributedDataParallel(model, comm)
        opt = OPTIMIZERS["adam"](net.parameters())
        for step in range(5):
            loss = loss_of(net, *local_slice(comm.rank, comm.size, step))
            opt.reset_grad()
            loss.backward()
            opt.step()
        out.append(list(net.full_state_dict().values()) if fsdp else snapshot(model))
    return out


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("ranks", [2, 4])
def test_equals_ddp_after_five_adam_steps(backend, ranks):
    if backend == "mpi" and ranks == 4:
        pytest.skip("one MPI size is enough")
    for ddp, fsdp in run_ranks(backend, ranks, ddp_vs_fsdp):
        assert_histories_equal([fsdp], [ddp])


def full_checkpoint(comm, directory):
    model = build("mlp", SEED + comm.rank)
    fsdp = FullyShardedDataParallel(model, comm)
    opt = OPTIMIZERS["adam"](fsdp.parameters())
    for step in range(2):
        loss = loss_of(fsdp, *local_slice(comm.rank, comm.size, step))
        opt.reset_grad()
        loss.backward()
        opt.step()
    state = fsdp.full_state_dict()
    fsdp.save_sharded(directory, optimizer=opt)
    # A fresh model from another seed, reloaded from the sharded files, continues identically.
    again = FullyShardedDataParallel(build("mlp", 99 + comm.rank), comm)
    opt2 = OPTIMIZERS["adam"](again.parameters())
    again.load_sharded(directory, optimizer=opt2)
    for net, o in ((fsdp, opt), (again, opt2)):
        loss = loss_of(net, *local_slice(comm.rank, comm.size, 2))
        o.reset_grad()
        loss.backward()
        o.step()
    return state, list(fsdp.full_state_dict().values()), list(again.full_state_dict().values())


def test_full_checkpoint_from_two_ranks_loads_on_one_and_sharded_reloads(tmp_path):
    directory = str(tmp_path / "ckpt")
    results = run_ranks(fast_backend(), 2, full_checkpoint, directory)
    state = results[0][0]
    plain = build("mlp", 0)
    plain.load_state_dict(state)  # same keys as the plain model's state_dict
    assert list(state) == list(plain.state_dict())
    want = reference("mlp", "adam", steps=2)[-1]
    assert_histories_equal([snapshot(plain)], [want])
    x, _ = whole_batch()
    assert plain(x).shape == (12, 3)
    for _, cont, reloaded in results:
        assert_histories_equal([reloaded], [cont], tol=0)
    assert sorted(os.listdir(directory)) == ["index.json", "shard-00000-of-00002.ndl",
                                             "shard-00001-of-00002.ndl"]


def reload_other_size(comm, directory):
    fsdp = FullyShardedDataParallel(build("mlp", 0), comm)
    try:
        fsdp.load_sharded(directory)
    except ValueError as err:
        return str(err)


def test_sharded_checkpoint_needs_the_same_world_size(tmp_path):
    directory = str(tmp_path / "ckpt")
    run_ranks(fast_backend(), 2, full_checkpoint, directory)
    for r, msg in enumerate(run_ranks(fast_backend(), 3, reload_other_size, directory)):
        assert f"(rank {r}): checkpoint was saved by 2 ranks, this job has 3" in msg


def mixed(comm, precision):
    fsdp = FullyShardedDataParallel(build("deep", SEED + comm.rank), comm,
                                    mixed_precision=precision)
    seen = []
    inner = fsdp.module.modules[0]
    real = inner.forward  # FSDP's wrapper around the layer

    def spy(x):
        out = real(x)
        seen.append(out.dtype)  # computed with the gathered 16-bit weights
        return out
    inner.forward = spy
    opt = ndl.optim.Adam(fsdp.parameters(), lr=0.01)
    before = [p.numpy().copy() for p in fsdp.parameters()]
    x, y = local_slice(comm.rank, comm.size)
    loss = ndl.nn.SoftmaxLoss()(fsdp(x.astype("float32")), y)
    loss.backward()
    grads = [p.grad.dtype for p in fsdp.parameters()]
    opt.step()
    after = [p.numpy() for p in fsdp.parameters()]
    return seen, [p.dtype for p in fsdp.parameters()], grads, before, after


@pytest.mark.parametrize("precision, compute", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_mixed_precision_updates_the_full_precision_master_shard(precision, compute):
    for seen, dtypes, grads, before, after in run_ranks(fast_backend(), 2, mixed, precision):
        assert seen == [compute]  # the unit computed in 16 bits
        assert set(dtypes) == set(grads) == {"float64"}  # master shards and their grads
        for b, a in zip(before, after):
            step = np.abs(a - b)
            assert 0.005 < step.max() < 0.02  # Adam's first step ~ lr, in full precision
            low = a.astype(np.float32).astype(np.float16).astype(np.float64)
            assert not np.allclose(a, low, rtol=0, atol=0)  # not rounded to 16 bits


def traffic(comm):
    """Payload bytes sent per rank in one step: DDP and FSDP on a ~200k-parameter MLP."""
    sent = []
    for fsdp in (False, True):
        np.random.seed(0)
        model = ndl.nn.Sequential(ndl.nn.Linear(256, 256), ndl.nn.ReLU(),
                                  ndl.nn.Linear(256, 256), ndl.nn.ReLU(), ndl.nn.Linear(256, 256))
        net = FullyShardedDataParallel(model, comm) if fsdp else \
            DistributedDataParallel(model, comm)
        x = ndl.Tensor(np.random.randn(4, 256), requires_grad=False)
        y = ndl.Tensor(np.arange(4), dtype="int64", requires_grad=False)
        comm.reset_stats()
        ndl.nn.SoftmaxLoss()(net(x), y).backward()
        sent.append(sum(v["bytes_sent"] for v in comm.stats.values()))
    return sent


@pytest.mark.parametrize("ranks", [2, 4])
def test_fsdp_sends_one_and_a_half_times_ddp(ranks):
    for ddp, fsdp in run_ranks(fast_backend(), ranks, traffic):
        assert abs(fsdp / ddp - 1.5) < 0.05 * 1.5, (fsdp, ddp)


def fsdp_state_bytes(comm):
    from needle.memory import MemoryTracker
    with MemoryTracker() as tracker:
        np.random.seed(0)
        model = ndl.nn.Sequential(ndl.nn.Linear(256, 256), ndl.nn.ReLU(),
                                  ndl.nn.Linear(256, 256), ndl.nn.ReLU(), ndl.nn.Linear(256, 8))
        psi = model.num_parameters()
        fsdp = FullyShardedDataParallel(model, comm)
        opt = ndl.optim.Adam(fsdp.parameters())
        x = ndl.Tensor(np.random.randn(4, 256), requires_grad=False)
        y = ndl.Tensor(np.arange(4) % 8, dtype="int64", requires_grad=False)
        loss = ndl.nn.SoftmaxLoss()(fsdp(x), y)
        loss.backward()
        opt.step()
        del loss
        live = tracker.current_bytes - 2 * x.realize_cached_data().nbytes
    return live, psi


@pytest.mark.mpi  # one process per rank: a MemoryTracker sees only its own rank
@pytest.mark.parametrize("ranks", [2, 4])
def test_model_state_bytes_are_16_psi_over_n(ranks):
    for live, psi in run_ranks("mpi", ranks, fsdp_state_bytes):
        want = 16 * psi / ranks
        assert abs(live - want) <= 0.05 * want, (live, want)


def bad_precision(comm):
    try:
        FullyShardedDataParallel(build("mlp", 0), comm, mixed_precision="int8")
    except ValueError as err:
        return str(err)


def test_bad_mixed_precision_names_the_rank():
    for r, msg in enumerate(run_ranks(fast_backend(), 2, bad_precision)):
        assert f"got 'int8' (rank {r})" in msg

"""Predicted bytes per step against the ledger of real runs on the virtual cluster."""
import numpy as np
import pytest

import needle as ndl
from benchmarks.needle_strategies import (
    needle_collectives,
    needle_fsdp_collectives,
    needle_pp_collectives,
)
from needle import nn
from needle.parallel import (
    DistributedDataParallel,
    FullyShardedDataParallel,
    ZeroRedundancyOptimizer,
    virtual,
)
from needle.plan.collective_sends import collective_steps
from needle.plan.comm_time import Collective, collective_bytes, layout_collectives, step_bytes
from needle.plan.layout import Layout, Setup
from needle.plan.model import ModelSpec


def _ledger_counts(comm, name, make):
    comm.ledger.reset()
    getattr(comm, name)(make(comm))
    return int(comm.ledger.total(name)), int(comm.ledger.total(name, field="messages"))


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("n", [7, 1001, 16384, 16385, 100003])
def test_collective_bytes_equal_the_ledger(p, n):
    """Every rank's ledger; the prediction is the busiest rank's (ring segments are uneven):
    bytes, and messages (pieces of below 1 MiB: one per send), e.g. log2 p rounds for a small
    allgather at p = 4, p - 1 at p = 3."""
    def run(comm):
        return (_ledger_counts(comm, "allreduce", lambda c: np.ones(n, np.float32)),
                _ledger_counts(comm, "allgather", lambda c: np.ones(n, np.float32)),
                _ledger_counts(comm, "reduce_scatter", lambda c: np.ones((c.size, n), np.float32)))
    got = virtual.run(p, run)
    for k, name in enumerate(("allreduce", "allgather", "reduce_scatter")):
        assert max(r[k][0] for r in got) == collective_bytes(name, n, 4, p), name
        msgs = collective_steps(name, n, 4, p).per_rank()[0]
        assert max(r[k][1] for r in got) == max(msgs) > 0, name


def _mlp():
    return nn.Sequential(nn.Linear(20, 300), nn.ReLU(), nn.Linear(300, 300), nn.ReLU(),
                         nn.Linear(300, 5))


def _train_and_count(comm, strategy, steps=2):
    np.random.seed(comm.rank)
    model = _mlp()
    if strategy == "ddp":
        net, opt = DistributedDataParallel(model, comm), None
        opt = ndl.optim.Adam(net.parameters(), lr=1e-3)
    elif strategy == "zero1":
        net = DistributedDataParallel(model, comm)
        opt = ZeroRedundancyOptimizer(model.parameters(), ndl.optim.Adam, comm, stage=1, lr=1e-3)
    elif strategy == "zero2":
        net = model
        opt = ZeroRedundancyOptimizer(model.parameters(), ndl.optim.Adam, comm, stage=2, lr=1e-3)
    else:
        net = FullyShardedDataParallel(model, comm)
        opt = ndl.optim.Adam(net.parameters(), lr=1e-3)
    comm.ledger.reset()
    rng = np.random.default_rng(comm.rank)
    for _ in range(steps):
        x = ndl.Tensor(rng.standard_normal((8, 20)).astype(np.float32), requires_grad=False)
        y = ndl.Tensor(rng.integers(0, 5, 8), dtype="int64", requires_grad=False)
        loss = nn.SoftmaxLoss()(net(x), y)
        opt.reset_grad()
        loss.backward()
        opt.step()
    return comm.ledger.total() / steps


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2"])
@pytest.mark.parametrize("p", [2, 3])
def test_needle_strategy_bytes_per_step_are_exact(strategy, p):
    """DDP, ZeRO-1 and ZeRO-2 on p virtual ranks: bytes per step == the ledger's, every rank."""
    measured = virtual.run(p, _train_and_count, strategy)
    sizes = [int(np.prod(q.shape)) for q in _mlp().parameters()]
    predicted = step_bytes(needle_collectives(sizes, 4, strategy, p))
    assert max(measured) == predicted
    assert predicted > 0


@pytest.mark.parametrize("p", [2, 3])
def test_needle_fsdp_bytes_per_step_are_exact(p):
    """FSDP on p virtual ranks (units: the three Linears, 6300 / 90300 / 1505 elements, the
    last a multiple of neither 2 nor 3): per-unit padding and usage flags make it exact where
    the textbook's 3 (N-1)/N Psi is not."""
    measured = virtual.run(p, _train_and_count, "fsdp")
    units = [(sum(int(q.size) for q in m.parameters()), len(m.parameters()))
             for m in _mlp().modules if m.parameters()]
    assert units == [(6300, 2), (90300, 2), (1505, 2)]
    predicted = step_bytes(needle_fsdp_collectives(units, 4, p))
    assert max(measured) == predicted
    textbook = step_bytes(layout_collectives(ModelSpec(params=98105), Layout(dp=p, zero=3),
                                             Setup(p, "fp32", "adam")))
    assert textbook != predicted


def test_layout_collectives_textbook_ratios():
    """Per step: ZeRO-2 sends what DDP sends, ZeRO-1 (needle's) and ZeRO-3 1.5x (ZeRO, sec. 7)."""
    spec = ModelSpec(params=1_200_000).check()
    setup = Setup(batch=4)
    d = 4
    b = {z: step_bytes(layout_collectives(spec, Layout(dp=d, zero=z), setup))
         for z in range(4)}
    psi_bytes = 1_200_000 * 2
    assert b[0] == 2 * (d - 1) / d * psi_bytes
    assert b[2] == pytest.approx(b[0], rel=1e-6)
    assert b[1] == pytest.approx(1.5 * b[0], rel=1e-6)
    assert b[3] == pytest.approx(1.5 * b[0], rel=1e-6)


def test_tp_and_pp_counts():
    """TP: 4 allreduces of s b h per layer and microbatch (6 with full recompute); PP: a
    middle stage sends forward and backward per microbatch; SP moves the same bytes as
    ring allreduces (messages above the recursive-doubling limit)."""
    spec = ModelSpec(8, 64, 4, 512, 100).check()
    setup = Setup(batch=8, precision="fp32")
    sbh = 512 * 2 * 64
    tp = layout_collectives(spec, Layout(tp=4, microbatch=2), setup)
    assert tp == [Collective("allreduce", "tp", 4, sbh, 4, 4 * 8 * 4)]
    full = layout_collectives(spec, Layout(tp=4, microbatch=2, recompute="full"), setup)
    assert full[0].calls == 6 * 8 * 4
    sp = layout_collectives(spec, Layout(tp=4, microbatch=2, sp=True), setup)
    assert step_bytes(sp) == step_bytes(tp) == 4 * 8 * 4 * 2 * 3 / 4 * sbh * 4
    pp = layout_collectives(spec, Layout(pp=2, microbatch=2), setup)   # ends: one way each
    assert pp == [Collective("send", "pp", 2, sbh, 4, 4, "pipeline")]
    pp4 = layout_collectives(spec, Layout(pp=4, microbatch=2), setup)  # a middle stage: both
    assert pp4 == [Collective("send", "pp", 4, sbh, 4, 2 * 4, "pipeline")]


def _pipeline_bytes(comm, m):
    from needle.parallel.pipeline import PipelineParallel, partition
    np.random.seed(0)
    model = nn.Sequential(*[nn.Linear(6, 6) for _ in range(comm.size)])
    pipe = PipelineParallel(partition(model, comm.size)[comm.rank], comm, m,
                            loss_fn=lambda out, y: ((out - y) ** 2).sum())
    rng = np.random.RandomState(0)
    x, y = rng.randn(4 * m, 6).astype(np.float32), rng.randn(4 * m, 6).astype(np.float32)
    # the first step of a batch shape also agrees on the batch (one allgather of three int64,
    # PipelineParallel._agree_batch); the planner predicts the steps after it
    pipe.train_step(x, y)
    comm.ledger.reset()
    pipe.train_step(x, y)
    return comm.ledger.total()


@pytest.mark.parametrize("p", [2, 3, 4])
def test_needle_pp_bytes_per_step_are_exact(p):
    """1F1B on p virtual stages, 3 microbatches of (4, 6) float32: the busiest stage's bytes,
    activation and gradient sends plus its part of the loss broadcast (the root's 8 B per
    child, 8 B where a middle stage relays it), equal the ledger's."""
    measured = virtual.run(p, _pipeline_bytes, 3)
    predicted = step_bytes(needle_pp_collectives(4, 1, 6, p, 3))
    assert max(measured) == predicted
    assert predicted % (4 * 6 * 4) == (0 if p == 3 else 8)  # p = 3: the middle relays nothing

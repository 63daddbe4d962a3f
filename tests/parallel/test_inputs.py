"""Parallel layers refuse what their serial layers refuse, on every rank, before any message.

Each case: the serial layer, the parallel layer that replaces it, a bad input, and a piece of
the bad value the error must name. The serial layer must refuse the input too (so the list is
the serial-vs-parallel table), and every rank of the parallel run must raise an error naming
itself and the value, with no message sent after construction (the ledger does not grow).
"""
import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.parallel import RankFailedError, virtual
from needle.parallel.moe import ExpertParallelMoE
from needle.parallel.pipeline import PipelineParallel
from needle.parallel.tensor_parallel import (
    ColumnParallelLinear,
    ParallelSelfAttention,
    ParallelTransformerBlock,
    RowParallelLinear,
    VocabParallelEmbedding,
    gathered_cross_entropy,
    vocab_parallel_cross_entropy,
)

P = 2  # ranks
LOGITS = np.random.RandomState(0).randn(4, 8).astype("float32")


def ints(a, dtype="int64"):
    return ndl.Tensor(np.array(a), dtype=dtype, requires_grad=False)


def f32(*shape):
    return ndl.Tensor(np.zeros(shape, "float32"))


def serial_ce(labels, dtype="int64"):
    return lambda: nn.SoftmaxLoss()(ndl.Tensor(LOGITS), ints(labels, dtype))


def parallel_ce(loss, labels, dtype="int64"):
    def call(comm):
        shard = LOGITS[:, comm.rank * 4:(comm.rank + 1) * 4]
        return lambda: loss(ndl.Tensor(shard), ints(labels, dtype), comm)
    return call


def layer_call(build, x):
    """A parallel layer built once (construction may talk), then called on ``x``."""
    def call(comm):
        layer = build(comm)
        return lambda: layer(x() if callable(x) else x)
    return call


def emb_ids(ids, dtype="int64"):
    return lambda: ints(ids, dtype)


# (case, serial call that must fail, parallel call builder, text the error must hold)
CASES = [
    ("ce label = V", serial_ce([0, 1, 2, 8]),
     parallel_ce(vocab_parallel_cross_entropy, [0, 1, 2, 8]), "got 8 at (3,)"),
    ("ce label < 0", serial_ce([0, -1, 2, 3]),
     parallel_ce(vocab_parallel_cross_entropy, [0, -1, 2, 3]), "got -1 at (1,)"),
    ("ce fractional label", serial_ce([0, 1, 2.5, 3], "float32"),
     parallel_ce(vocab_parallel_cross_entropy, [0, 1, 2.5, 3], "float32"), "got 2.5 at (2,)"),
    ("ce labels (3,)", serial_ce([0, 1, 2]),
     parallel_ce(vocab_parallel_cross_entropy, [0, 1, 2]), "(4, 4) and (3,)"),
    ("gathered ce label = V", serial_ce([9, 1, 2, 3]),
     parallel_ce(gathered_cross_entropy, [9, 1, 2, 3]), "got 9 at (0,)"),
    ("embedding id = V", lambda: nn.Embedding(8, 3)(ints([[0, 8]])),
     layer_call(lambda c: VocabParallelEmbedding(8, 3, c), emb_ids([[0, 8]])), "got 8 at (0, 1)"),
    ("embedding id < 0", lambda: nn.Embedding(8, 3, gather=True)(ints([[-3, 0]])),
     layer_call(lambda c: VocabParallelEmbedding(8, 3, c), emb_ids([[-3, 0]])),
     "got -3 at (0, 0)"),
    ("embedding fractional id", lambda: nn.Embedding(8, 3)(ints([[0.5, 1]], "float32")),
     layer_call(lambda c: VocabParallelEmbedding(8, 3, c), emb_ids([[0.5, 1]], "float32")),
     "got 0.5 at (0, 0)"),
    ("column width", lambda: nn.Linear(4, 6)(f32(2, 5)),
     layer_call(lambda c: ColumnParallelLinear(4, 6, c), lambda: f32(2, 5)), "shape (2, 5)"),
    ("row width (full input)", lambda: nn.Linear(4, 6)(f32(2, 5)),
     layer_call(lambda c: RowParallelLinear(4, 6, c, input_is_parallel=False),
                lambda: f32(2, 5)), "shape (2, 5)"),
    ("row width (parallel input)", lambda: nn.Linear(4, 6)(f32(2, 5)),
     layer_call(lambda c: RowParallelLinear(4, 6, c), lambda: f32(2, 3)), "shape (2, 3)"),
    ("attention 2-d input", lambda: nn.AttentionLayer(8, 2, 4)(f32(3, 8)),
     layer_call(lambda c: ParallelSelfAttention(8, 2, 4, c), lambda: f32(3, 8)),
     "shape (3, 8)"),
    ("attention width", lambda: nn.AttentionLayer(8, 2, 4)(f32(1, 3, 7)),
     layer_call(lambda c: ParallelSelfAttention(8, 2, 4, c), lambda: f32(1, 3, 7)),
     "shape (1, 3, 7)"),
    ("block 2-d input", lambda: nn.TransformerLayer(8, 2, 4, 16)(f32(3, 8)),
     layer_call(lambda c: ParallelTransformerBlock(8, 2, 4, 16, c), lambda: f32(3, 8)),
     "shape (3, 8)"),
    ("moe width", lambda: nn.MoE(4, 8, 2)(f32(3, 5)),
     layer_call(lambda c: ExpertParallelMoE(4, 8, 2, c), lambda: f32(3, 5)), "shape (3, 5)"),
    ("column device", lambda: nn.Linear(4, 6)(ndl.Tensor(np.zeros((2, 4)), device=ndl.cuda())),
     layer_call(lambda c: ColumnParallelLinear(4, 6, c),
                lambda: ndl.Tensor(np.zeros((2, 4), "float32"), device=ndl.cuda())),
     "input on cuda"),
]


def _attempt(comm, case):
    """Build (talking), then call with the bad input; the error and the messages it cost."""
    call = {c[0]: c[2] for c in CASES}[case](comm)
    before = len(comm.ledger)
    try:
        call()
    except (ValueError, TypeError) as err:
        return type(err).__name__, str(err), len(comm.ledger) - before
    return None, "accepted", len(comm.ledger) - before


def _skip_without_cuda(case):
    if "device" in case and not ndl.cuda().enabled():
        pytest.skip("no CUDA device (nor the emulator)")


@pytest.mark.parametrize("case,serial,_,text", CASES, ids=[c[0] for c in CASES])
def test_parallel_refuses_what_serial_refuses(case, serial, _, text):
    _skip_without_cuda(case)
    with pytest.raises((ValueError, TypeError, RuntimeError)):
        serial()
    for rank, (kind, msg, sent) in enumerate(virtual.run(P, _attempt, case, timeout=10)):
        assert kind is not None, f"{case}: rank {rank} accepted the bad input"
        assert f"on rank {rank} of {P}" in msg and text in msg, msg
        assert sent == 0, f"{case}: rank {rank} sent {sent} messages before refusing"


def _bad_on_rank_one(comm):
    labels = [0, 1, 2, 9] if comm.rank == 1 else [0, 1, 2, 3]
    shard = LOGITS[:, comm.rank * 4:(comm.rank + 1) * 4]
    return vocab_parallel_cross_entropy(ndl.Tensor(shard), ints(labels), comm).numpy()


def test_bad_labels_on_one_rank_name_that_rank():
    with pytest.raises(RankFailedError) as info:
        virtual.run(P, _bad_on_rank_one, timeout=10)
    assert info.value.rank == 1 and "on rank 1 of 2" in str(info.value)
    assert "got 9 at (3,)" in str(info.value)


def _sequence_split(comm, which):
    layers = {"embedding": (lambda: VocabParallelEmbedding(8, 4, comm, sequence_parallel=True),
                            lambda: ints([[0, 1, 2]])),
              "row": (lambda: RowParallelLinear(4, 4, comm, sequence_parallel=True),
                      lambda: f32(1, 3, 2)),
              "column": (lambda: ColumnParallelLinear(4, 4, comm, sequence_parallel=True),
                         lambda: f32(3, 4))}
    build, x = layers[which]
    layer = build()
    try:
        layer(x())
    except ValueError as err:
        return str(err)
    return "accepted"


@pytest.mark.parametrize("which,text", [
    ("embedding", "the sequence axis 1 of input (1, 3) (3) does not split into 2"),
    ("row", "the sequence axis 1 of input (1, 3, 2) (3) does not split into 2"),
    ("column", "got input of shape (3, 4)"),
])
def test_sequence_parallel_input_must_split(which, text):
    for rank, msg in enumerate(virtual.run(P, _sequence_split, which, timeout=10)):
        assert text in msg and f"on rank {rank} of {P}" in msg, msg


def _pipeline(comm, x, y, num_classes):
    stage = nn.Sequential(nn.Linear(4, 4)) if comm.rank == 0 else nn.Sequential(nn.Linear(4, 3))
    pipe = PipelineParallel(stage, comm, 2, loss_fn=nn.SoftmaxLoss(), num_classes=num_classes)
    before = len(comm.ledger)
    try:
        pipe.train_step(x, y)
    except (ValueError, TypeError) as err:
        return str(err), len(comm.ledger) - before
    return "accepted", len(comm.ledger) - before


@pytest.mark.parametrize("y,num_classes,text", [
    (np.array([0, 1, 3, 2]), 3, "indices must lie in [0, 3), got 3 at (2,)"),
    (np.array([0, 1, 1.5, 2]), 3, "whole numbers, got 1.5"),
    (np.array(["a", "b", "c", "d"]), None, "targets must be a numeric batch"),
    (np.array([0, 1, 2]), None, "2 microbatches do not divide the batch of 4 (targets: 3)"),
])
def test_pipeline_checks_the_batch_on_every_stage(y, num_classes, text):
    x = np.random.RandomState(1).randn(4, 4)
    for rank, (msg, sent) in enumerate(virtual.run(P, _pipeline, x, y, num_classes, timeout=10)):
        assert text in msg and f"on rank {rank} of {P}" in msg, msg
        assert sent == 0

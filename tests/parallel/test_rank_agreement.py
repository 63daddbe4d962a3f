"""Ranks that disagree on an input that must agree: every rank raises, naming both ranks' values.

Each case hands rank 0 and rank 1 different values of one input every rank must hold equal
(targets, ids, shard widths, batch and sequence lengths, dtypes) and lists the text every rank's
error must hold: the layer and each rank's value. Before these checks the vocabulary-parallel
loss returned one wrong loss on both ranks, and the embedding mixed two lookups.
"""
import numpy as np
import pytest
from mpi_helpers import run_ranks

import needle as ndl
from needle import nn
from needle.parallel import virtual
from needle.parallel.input_agreement import by_rank, checksum, pack, unpack
from needle.parallel.moe import ExpertParallelMoE
from needle.parallel.pipeline import PipelineParallel, partition
from needle.parallel.tensor_parallel import (
    ColumnParallelLinear,
    ParallelSelfAttention,
    ParallelTransformerBlock,
    RowParallelLinear,
    VocabParallelEmbedding,
    gathered_cross_entropy,
    vocab_parallel_cross_entropy,
)

P = 2


def f32(*shape, dtype="float32"):
    return ndl.Tensor(np.ones(shape, dtype), dtype=dtype)


def ids(a):
    return ndl.Tensor(np.array(a), dtype="int64", requires_grad=False)


def _ce(loss, width, targets):
    return lambda c: loss(f32(3, width(c.rank)), np.array(targets(c.rank)), c).numpy()


def _layer(build, x):
    return lambda c: build(c)(x(c.rank))


def _pipeline(batch, target_seed):
    def step(c):
        np.random.seed(0)
        model = nn.Sequential(*[nn.Linear(6, 6) for _ in range(c.size)])
        pipe = PipelineParallel(partition(model, c.size)[c.rank], c, 2,
                                loss_fn=lambda out, y: ((out - y) ** 2).sum())
        b = batch(c.rank)
        x = np.random.RandomState(0).randn(b, 6).astype(np.float32)
        y = np.random.RandomState(target_seed(c.rank)).randn(b, 6).astype(np.float32)
        return pipe.train_step(x, y)
    return step


def crc(a):
    return f"{checksum(np.array(a, dtype=np.int64)):#010x}"


def same(rank):
    """Every rank's shard width."""
    return 4


CASES = {
    "vocab ce targets": (_ce(vocab_parallel_cross_entropy, same, lambda r: [0, 1, r]),
                         ["VocabParallelCrossEntropy", "targets (CRC-32)",
                          f"rank 0 has {crc([0, 1, 0])}", f"rank 1 has {crc([0, 1, 1])}"]),
    "vocab ce widths": (_ce(vocab_parallel_cross_entropy, lambda r: 4 + r, lambda r: [0, 1, 2]),
                        ["VocabParallelCrossEntropy", "shard width: rank 0 has 4, rank 1 has 5"]),
    "gathered ce targets": (_ce(gathered_cross_entropy, same, lambda r: [0, 1, r]),
                            ["gathered_cross_entropy", f"rank 0 has {crc([0, 1, 0])}",
                             f"rank 1 has {crc([0, 1, 1])}"]),
    "gathered ce widths": (_ce(gathered_cross_entropy, lambda r: 4 + r, lambda r: [0, 1, 2]),
                           ["gathered_cross_entropy", "shard width: rank 0 has 4, rank 1 has 5"]),
    "embedding ids": (_layer(lambda c: VocabParallelEmbedding(8, 3, c),
                             lambda r: ids([[0, 1 + r]])),
                      ["VocabParallelEmbedding(8, 3)", "ids (CRC-32)", "rank 0 has 0x",
                       "rank 1 has 0x"]),
    "embedding ids (SP)": (_layer(lambda c: VocabParallelEmbedding(8, 4, c,
                                                                   sequence_parallel=True),
                                  lambda r: ids([[0, 1 + r]])),
                           ["VocabParallelEmbedding(8, 4)", "ids (CRC-32)", "rank 0 has 0x",
                            "rank 1 has 0x"]),
    "column sequence shards (SP)": (
        _layer(lambda c: ColumnParallelLinear(4, 4, c, sequence_parallel=True),
               lambda r: f32(1, 2 + r, 4)),
        ["ColumnParallelLinear(4, 4)", "ranks [0]: allgather dtype=float32 shape=(2, 1, 4)",
         "ranks [1]: allgather dtype=float32 shape=(3, 1, 4)"]),
    "column batch (gather_output)": (
        _layer(lambda c: ColumnParallelLinear(4, 4, c, gather_output=True),
               lambda r: f32(1 + r, 4)),
        ["ColumnParallelLinear(4, 4)", "ranks [0]: allgather dtype=float32 shape=(2, 1)",
         "ranks [1]: allgather dtype=float32 shape=(2, 2)"]),
    "row batch": (_layer(lambda c: RowParallelLinear(4, 4, c), lambda r: f32(1 + r, 2)),
                  ["RowParallelLinear(4, 4)", "ranks [0]: allreduce op=sum dtype=float32 "
                   "shape=(1, 4)", "ranks [1]: allreduce op=sum dtype=float32 shape=(2, 4)"]),
    "row sequence shards (SP)": (
        _layer(lambda c: RowParallelLinear(4, 4, c, sequence_parallel=True),
               lambda r: f32(1, 2 + 2 * r, 2)),
        ["RowParallelLinear(4, 4)", "ranks [0]: reduce_scatter", "shape=(2, 1, 4)",
         "ranks [1]: reduce_scatter", "shape=(4, 1, 4)"]),
    "attention sequence shards (SP)": (
        _layer(lambda c: ParallelSelfAttention(8, 2, 4, c, sequence_parallel=True),
               lambda r: f32(1, 2 + r, 8)),
        ["ParallelSelfAttention(8)", "ranks [0]: allgather dtype=float32 shape=(2, 3, 1, 8)",
         "ranks [1]: allgather dtype=float32 shape=(3, 3, 1, 8)"]),
    # without SP the first collective is the output projection's: it names itself
    "attention sequence length": (
        _layer(lambda c: ParallelSelfAttention(8, 2, 4, c), lambda r: f32(1, 2 + r, 8)),
        ["RowParallelLinear(8, 8)", "shape=(1, 2, 8)", "shape=(1, 3, 8)"]),
    "block sequence length": (
        _layer(lambda c: ParallelTransformerBlock(8, 2, 4, 16, c), lambda r: f32(1, 2 + r, 8)),
        ["RowParallelLinear(8, 8)", "shape=(1, 2, 8)", "shape=(1, 3, 8)"]),
    "moe token dtype": (
        _layer(lambda c: ExpertParallelMoE(4, 8, 2, c),
               lambda r: f32(3, 4, dtype=["float32", "float64"][r])),
        ["ExpertParallelMoE(d_model=4)", "ranks [0]: alltoall dtype=float32",
         "ranks [1]: alltoall dtype=float64"]),
    "pipeline targets": (_pipeline(lambda r: 4, lambda r: r),
                         ["PipelineParallel.train_step", "targets (CRC-32): rank 0 has 0x",
                          "rank 1 has 0x"]),
    "pipeline batch": (_pipeline(lambda r: 4 + 2 * r, lambda r: 0),
                       ["PipelineParallel.train_step", "batch: rank 0 has 4, rank 1 has 6"]),
}


def _attempt(comm, case):
    """The case's call on this rank: its error's type and text, or what it returned."""
    try:
        out = CASES[case][0](comm)
    except (ValueError, TypeError) as err:
        return type(err).__name__, str(err)
    return None, repr(out)


@pytest.mark.parametrize("case", sorted(CASES))
def test_disagreeing_ranks_all_raise_naming_both(case):
    for rank, (kind, msg) in enumerate(virtual.run(P, _attempt, case, timeout=10)):
        assert kind is not None, f"{case}: rank {rank} returned {msg}"
        assert f"(rank {rank} of {P})" in msg, msg
        for text in CASES[case][1]:
            assert text in msg, (case, text, msg)


def _agreeing_loss(comm):
    z = np.random.RandomState(0).randn(3, 8).astype(np.float32)
    shard = z[:, comm.rank * 4:(comm.rank + 1) * 4]
    return [float(fn(ndl.Tensor(shard), np.array([0, 5, 7]), comm).numpy())
            for fn in (vocab_parallel_cross_entropy, gathered_cross_entropy)]


def test_agreeing_ranks_pass_and_match_the_serial_loss():
    z = np.random.RandomState(0).randn(3, 8).astype(np.float32)
    want = float(nn.SoftmaxLoss()(ndl.Tensor(z), ids([0, 5, 7])).numpy())
    for losses in virtual.run(P, _agreeing_loss, timeout=10):
        np.testing.assert_allclose(losses, [want, want], rtol=1e-5)


def _targets_of_two_int_dtypes(comm):
    z = ndl.Tensor(np.zeros((3, 4), np.float32))
    t = np.array([0, 5, 7], dtype=[np.int64, np.int32][comm.rank])
    from needle.parallel.tensor_parallel.cross_entropy import VocabParallelCrossEntropy
    return [float(vocab_parallel_cross_entropy(z, t, comm).numpy()),
            float(VocabParallelCrossEntropy(t, comm)(z).numpy())]


def test_equal_targets_of_two_integer_dtypes_agree():
    np.testing.assert_allclose(virtual.run(P, _targets_of_two_int_dtypes, timeout=10),
                               [[np.log(8)] * 2] * P, rtol=1e-6)


def test_checksum_sees_values_shape_and_dtype():
    a = np.arange(6, dtype=np.int64)
    sums = {checksum(a), checksum(a.reshape(2, 3)), checksum(a.astype(np.int32)),
            checksum(a[::-1]), checksum(np.where(a == 5, 6, a))}
    assert len(sums) == 5
    assert checksum(a.reshape(2, 3).T) == checksum(np.ascontiguousarray(a.reshape(2, 3).T))
    assert checksum(ndl.Tensor(a, dtype="int64")) == checksum(a)


def test_pack_keeps_each_field_and_refuses_too_many_bits():
    bits = (32, 30)
    assert unpack(pack((0xDEADBEEF, 5), bits), bits) == [0xDEADBEEF, 5]
    with pytest.raises(ValueError, match="63 bits"):
        pack((1, 1), (32, 31))


def test_by_rank_groups_ranks_holding_one_value():
    assert by_rank([4, 5, 5]) == "rank 0 has 4, ranks [1, 2] have 5"


def _mpi_targets_disagree(comm):
    return _attempt(comm, "vocab ce targets")


@pytest.mark.mpi
def test_vocab_parallel_targets_disagreeing_under_mpiexec():
    every = run_ranks("mpi", P, _mpi_targets_disagree, timeout=120,
                      env={"NEEDLE_COMM_TIMEOUT": "10"})
    for rank, (kind, msg) in enumerate(every):
        assert kind is not None and f"(rank {rank} of {P})" in msg, msg
        for text in CASES["vocab ce targets"][1]:
            assert text in msg, (text, msg)


BAD_SIZES = {  # a constructor with a size that is not a whole number >= 1, and its name
    "column 4.5": (lambda c: ColumnParallelLinear(4, 4.5, c),
                   "ColumnParallelLinear on rank {r} of 2: out_features 4.5"),
    "row nan": (lambda c: RowParallelLinear(float("nan"), 4, c),
                "RowParallelLinear on rank {r} of 2: in_features nan"),
    "embedding dim 0": (lambda c: VocabParallelEmbedding(8, 0, c),
                        "VocabParallelEmbedding on rank {r} of 2: embedding_dim 0"),
    "attention heads 2.5": (lambda c: ParallelSelfAttention(8, 2.5, 4, c),
                            "ParallelSelfAttention on rank {r} of 2: num_head 2.5"),
    "moe experts 2.5": (lambda c: ExpertParallelMoE(4, 8, 2.5, c),
                        "ExpertParallelMoE on rank {r} of 2: num_experts 2.5"),
    "moe d_model -4": (lambda c: ExpertParallelMoE(-4, 8, 2, c),
                       "ExpertParallelMoE on rank {r} of 2: d_model -4"),
}


def _build(comm, case):
    try:
        BAD_SIZES[case][0](comm)
    except ValueError as err:
        return str(err)
    return "accepted"


@pytest.mark.parametrize("case", sorted(BAD_SIZES))
def test_sizes_must_be_whole_numbers_before_they_are_divided(case):
    """``ColumnParallelLinear(4, 4.5)`` said "not divisible by the tensor-parallel size"."""
    for rank, msg in enumerate(virtual.run(P, _build, case, timeout=10)):
        assert BAD_SIZES[case][1].format(r=rank) + " must be a whole number >= 1" in msg, msg


def _whole_floats(comm):
    layer = ColumnParallelLinear(4.0, 6.0, comm)
    return layer.in_features, layer.out_per_rank, type(layer.out_per_rank).__name__


def test_whole_float_sizes_are_taken_as_ints():
    assert virtual.run(P, _whole_floats, timeout=10) == [(4, 3, "int")] * P

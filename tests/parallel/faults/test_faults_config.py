"""Fault injection, misuse: ranks built with different settings raise at construction, on every
rank, naming the setting and each rank's value (not a collective's sizes or a shape error)."""
import numpy as np
import pytest
from mpi_helpers import BACKENDS, run_ranks

import needle as ndl
from needle import nn
from needle.parallel import (
    DistributedDataParallel,
    FullyShardedDataParallel,
    ParameterServer,
    ZeroRedundancyOptimizer,
    virtual,
)
from needle.parallel.pipeline.pipeline_parallel import PipelineParallel

pytestmark = pytest.mark.faults


def _model():
    np.random.seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def _build(comm, what):
    """Construct ``what`` with one setting that differs on rank 1; the error message."""
    one = comm.rank == 1
    try:
        if what == "ddp":
            DistributedDataParallel(_model(), comm, bucket_cap_mb=1.0 if one else 25.0)
        elif what == "zero_stage":
            ZeroRedundancyOptimizer(_model().parameters(), ndl.optim.SGD, comm,
                                    stage=2 if one else 1, lr=0.1)
        elif what == "zero_lr":
            ZeroRedundancyOptimizer(_model().parameters(), ndl.optim.Adam, comm,
                                    lr=0.01 if one else 0.001)
        elif what == "fsdp":
            FullyShardedDataParallel(_model(), comm, mixed_precision="bf16" if one else None)
        elif what == "pipeline":
            PipelineParallel(nn.Linear(4, 4), comm, num_microbatches=8 if one else 4)
        elif what == "moe":
            from needle.parallel.moe.expert_parallel import ExpertParallelMoE
            ExpertParallelMoE(4, 8, 2, comm, top_k=2 if one else 1)
        elif what == "ps":
            ParameterServer(comm, _model(), ndl.optim.SGD, consistency="ssp",
                            staleness=3 if one else 2, lr=0.1)
    except ValueError as err:
        return str(err)
    return None


CASES = {
    "ddp": "bucket_cap_mb: rank 0 has 25.0, rank 1 has 1.0",
    "zero_stage": "stage: rank 0 has 1, rank 1 has 2",
    "zero_lr": "optimizer.lr: rank 0 has 0.001, rank 1 has 0.01",
    "fsdp": "mixed_precision: rank 0 has None, rank 1 has 'bf16'",
    "pipeline": "num_microbatches: rank 0 has 4, rank 1 has 8",
    "ps": "staleness: rank 0 has 2, rank 1 has 3",
    "moe": "top_k: rank 0 has 1, rank 1 has 2",
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_disagreeing_settings_are_named_on_every_rank(backend):
    for what, want in CASES.items():
        for r, msg in enumerate(run_ranks(backend, 2, _build, what, timeout=90,
                                          env={"NEEDLE_COMM_TIMEOUT": "10"})):
            assert msg is not None and want in msg, (what, r, msg)
            assert f"(rank {r}): ranks disagree on their settings" in msg, msg


def _build_model_parallel(comm, what):
    """Tensor-, sequence-, expert-parallel and 3D set-ups with one setting that differs on
    rank 1; the error message (None if nothing was raised)."""
    from needle.parallel.mesh import ProcessMesh
    from needle.parallel.moe.expert_parallel import ExpertParallelMoE
    from needle.parallel.tensor_parallel.layers import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
    )
    from needle.parallel.tensor_parallel.transformer import ParallelTransformerBlock
    one = comm.rank == 1
    builders = {
        "tp_sequence_parallel": lambda: ParallelTransformerBlock(
            8, 2, 4, 16, comm, sequence_parallel=one),
        "tp_num_head": lambda: ParallelTransformerBlock(8, 4 if one else 2, 2, 16, comm),
        "tp_column_gather": lambda: ColumnParallelLinear(4, 8, comm, gather_output=one),
        "tp_row_input": lambda: RowParallelLinear(8, 4, comm, input_is_parallel=not one),
        "tp_vocab": lambda: VocabParallelEmbedding(12 if one else 10, 4, comm),
        "moe_num_experts": lambda: ExpertParallelMoE(4, 8, 4 if one else 2, comm),
        "moe_capacity": lambda: ExpertParallelMoE(4, 8, 2, comm,
                                                  capacity_factor=2.0 if one else 1.25),
        "mesh_tp": lambda: ProcessMesh(comm, dp=1 if one else 2, tp=2 if one else 1),
    }
    try:
        builders[what]()
    except ValueError as err:
        return str(err)
    return None


def _build_every_model_parallel(comm):
    return [_build_model_parallel(comm, what) for what in MODEL_PARALLEL_CASES]


MODEL_PARALLEL_CASES = {
    "tp_sequence_parallel": "ParallelSelfAttention (rank {r}): ranks disagree on their settings: "
                            "sequence_parallel: rank 0 has False, rank 1 has True",
    "tp_num_head": "num_head: rank 0 has 2, rank 1 has 4",
    "tp_column_gather": "ColumnParallelLinear (rank {r}): ranks disagree on their settings: "
                        "gather_output: rank 0 has False, rank 1 has True",
    "tp_row_input": "input_is_parallel: rank 0 has True, rank 1 has False",
    "tp_vocab": "VocabParallelEmbedding (rank {r}): ranks disagree on their settings: "
                "num_embeddings: rank 0 has 10, rank 1 has 12",
    "moe_num_experts": "num_experts: rank 0 has 2, rank 1 has 4",
    "moe_capacity": "capacity_factor: rank 0 has 1.25, rank 1 has 2.0",
    "mesh_tp": "ProcessMesh (rank {r}): ranks disagree on their settings: dp: rank 0 has 2, "
               "rank 1 has 1; tp: rank 0 has 1, rank 1 has 2",
}


@pytest.mark.parametrize("what", sorted(MODEL_PARALLEL_CASES))
def test_model_parallel_settings_disagreeing_are_named_on_every_rank(what):
    """Before, tp_sequence_parallel gave a shape error deep in a matmul and mesh_tp split the
    ranks into groups that did not match (no error at all on 2 ranks)."""
    for r, msg in enumerate(virtual.run(2, _build_model_parallel, what)):
        want = MODEL_PARALLEL_CASES[what].format(r=r)
        assert msg is not None and want in msg, (what, r, msg)


@pytest.mark.mpi
def test_model_parallel_settings_disagreeing_under_mpiexec():
    every = run_ranks("mpi", 2, _build_every_model_parallel, timeout=120,
                      env={"NEEDLE_COMM_TIMEOUT": "10"})
    for r, msgs in enumerate(every):
        for what, msg in zip(MODEL_PARALLEL_CASES, msgs):
            want = MODEL_PARALLEL_CASES[what].format(r=r)
            assert msg is not None and want in msg, (what, r, msg)


def _moe_forward_on_rank_0_only(comm):
    from needle.parallel.moe.expert_parallel import ExpertParallelMoE
    np.random.seed(0)
    moe = ExpertParallelMoE(4, 8, 2, comm)
    if comm.rank == 0:  # rank 1 leaves: no configuration differs
        moe(ndl.Tensor(np.ones((3, 4), dtype="float32")))


def test_a_rank_that_left_is_not_reported_as_a_configuration_disagreement():
    """ExpertParallelMoE wrapped every error of its count exchange (a deadlock here) in
    'ranks disagree on the configuration'."""
    from needle.parallel import CommTimeoutError, RankFailedError
    with pytest.raises(RankFailedError) as info:
        virtual.run(2, _moe_forward_on_rank_0_only, timeout=1)
    err = info.value.errors[0]
    assert isinstance(err, CommTimeoutError), err
    assert "allgather (call #2) on rank 0 of 2, waiting for ranks [1]" in str(err), err
    assert "disagree" not in str(err)


def test_numpy_scalar_settings_are_compared_by_value():
    """Settings read through NumPy (an np.float32 learning rate, np.int64 sizes) are compared
    by value, and a difference is named like any other (JSON cannot encode NumPy scalars)."""
    from needle.parallel.comm.agree import agree

    def build(comm, lr_one):
        try:
            agree(comm, "Config", {"lr": np.float32(lr_one if comm.rank else 0.25),
                                   "steps": np.int64(4), "sizes": (np.int64(2), 3)})
        except ValueError as err:
            return str(err)
        return None
    assert virtual.run(2, build, 0.25, timeout=10) == [None, None]
    for r, msg in enumerate(virtual.run(2, build, 0.5, timeout=10)):
        assert msg is not None and f"Config (rank {r}): ranks disagree" in msg, msg
        assert "lr: rank 0 has 0.25, rank 1 has 0.5" in msg and "steps" not in msg, msg

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

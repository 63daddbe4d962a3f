"""Collectives on CUDA arrays: staged through the host, results back on the GPU (needs a GPU).

Two ranks share the one GPU (virtual cluster, and two MPI processes).  The host round trip costs
two PCIe copies per call (device -> host before, host -> device after); see README "Parallel".
"""
import numpy as np
import pytest
from mpi_helpers import BACKENDS, run_ranks

import needle as ndl

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not ndl.cuda().enabled(), reason="no GPU")]


def _on_gpu(comm):
    x = ndl.Tensor(np.full((4, 3), comm.rank + 1.0, dtype=np.float32), device=ndl.cuda(),
                   requires_grad=False)
    nd = ndl.NDArray(np.arange(6, dtype=np.float32) * (comm.rank + 1), device=ndl.cuda())
    total, gathered = comm.allreduce(x), comm.allgather(nd)
    return (str(total.device), total.numpy().tolist(), str(gathered.device),
            gathered.numpy().tolist())


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ranks_sharing_one_gpu(backend: str) -> None:
    for dev, total, gdev, gathered in run_ranks(backend, 2, _on_gpu):
        assert "cuda" in dev and "cuda" in gdev
        assert total == [[3.0] * 3] * 4
        assert gathered == (np.arange(6) * 1.0).tolist() + (np.arange(6) * 2.0).tolist()

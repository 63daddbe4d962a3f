"""needle.parallel.devices: each rank's device from its local rank, modulo the node's GPUs."""
import pytest

import needle as ndl
from needle.parallel import devices


@pytest.fixture
def no_launcher(monkeypatch):
    for var in devices.LOCAL_RANK_ENV:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_launcher_variables_give_the_local_rank(no_launcher):
    assert devices.local_rank_from_env() is None and devices.local_rank() == 0
    no_launcher.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    assert devices.local_rank() == 3
    no_launcher.setenv("MPI_LOCALRANKID", "5")  # MPICH's comes first
    assert devices.local_rank() == 5


def test_a_bad_launcher_variable_is_named(no_launcher):
    no_launcher.setenv("SLURM_LOCALID", "x1")
    with pytest.raises(ValueError, match="SLURM_LOCALID='x1'"):
        devices.local_rank()
    no_launcher.setenv("SLURM_LOCALID", "\u0663")  # '٣'.isdigit() is True; int('٣') is 3
    with pytest.raises(ValueError, match="SLURM_LOCALID='\u0663' is not a local rank"):
        devices.local_rank()


def test_device_for_wraps_ranks_over_the_gpus():
    assert devices.device_for("cpu", 7) == ndl.cpu()
    with pytest.raises(ValueError, match="'tpu'.*rank 4"):
        devices.device_for("tpu", 0, rank=4)
    gpus = devices.cuda_device_count()
    if gpus == 0:
        with pytest.raises(RuntimeError, match="no GPU is enabled on rank 2"):
            devices.device_for("cuda", 0, rank=2)
        return
    assert [devices.device_for("cuda", r) for r in range(2 * gpus)] == \
        [ndl.cuda(r % gpus) for r in range(2 * gpus)]


def local_ranks_both_ways(comm):
    """(the launcher's local rank, MPI's shared-memory split rank with the variables unset)."""
    import os

    from mpi4py import MPI
    from_env = devices.local_rank()
    for var in devices.LOCAL_RANK_ENV:
        os.environ.pop(var, None)
    return from_env, devices.local_rank(MPI.COMM_WORLD), comm.rank


@pytest.mark.mpi
def test_local_rank_from_the_launcher_and_from_mpi_agree_on_one_node():
    from mpi_helpers import run_ranks
    for from_env, from_mpi, rank in run_ranks("mpi", 3, local_ranks_both_ways, timeout=60):
        assert from_env == from_mpi == rank

"""Which device each rank computes on: its index on its node (as ``torchrun``'s ``LOCAL_RANK``),
modulo the node's GPUs. An application asks once and tells its layers; no layer asks MPI."""
import os
from typing import Any, Optional

from .. import numbers
from ..backend_ndarray import BackendDevice, cpu, cuda

# Launchers' local-rank variables: MPICH (Hydra), Open MPI, PMI, Slurm, torchrun
LOCAL_RANK_ENV = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK",
                  "SLURM_LOCALID", "LOCAL_RANK")


def local_rank_from_env() -> Optional[int]:
    """The launcher's local rank of this process, or None when no launcher variable is set."""
    for var in LOCAL_RANK_ENV:
        raw = os.environ.get(var, "").strip()
        if raw:
            try:  # ASCII digits: int('٣') is 3, but no launcher writes it
                return numbers.count(raw, var, lo=0)
            except numbers.NumberError:
                raise ValueError(f"{var}={raw!r} is not a local rank (a whole number >= 0 "
                                 "in ASCII digits)") from None
    return None


def local_rank(mpi_comm: Any = None) -> int:
    """This rank's index on its node: the launcher's variable, else MPI's shared-memory split
    of ``mpi_comm`` (collective over it), else 0 for a single process."""
    env = local_rank_from_env()
    if env is not None or mpi_comm is None:
        return 0 if env is None else env
    from mpi4py import MPI
    node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=mpi_comm.Get_rank())
    try:
        return int(node.Get_rank())
    finally:
        node.Free()


def cuda_device_count() -> int:
    """GPUs needle can use in this process (emulated ones under NEEDLE_CUDA_EMULATOR): the CUDA
    backend's one answer (its runtime's count), 0 where the backend is not enabled."""
    dev = cuda()
    return int(dev.device_count()) if dev.enabled() else 0


def device_for(kind: str, local: int, rank: int = 0) -> BackendDevice:
    """``cpu()``, or ``cuda(local % gpus)`` for ``kind`` "cuda"; errors name the rank."""
    if kind == "cpu":
        return cpu()
    if kind != "cuda":
        raise ValueError(f"device kind must be 'cpu' or 'cuda', got {kind!r} (rank {rank})")
    gpus = cuda_device_count()
    if gpus == 0:
        raise RuntimeError(f"device 'cuda': no GPU is enabled on rank {rank} (no GPU or CuPy; "
                           "NEEDLE_CUDA_EMULATOR=1 emulates one)")
    return cuda(local % gpus)

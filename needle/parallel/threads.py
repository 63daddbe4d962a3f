"""BLAS/OpenMP threads per rank: the node's cores shared among the ranks on it.

Each process's BLAS starts one thread per core it sees, so ``mpiexec -n 2`` on two cores runs
four threads that preempt each other in every matmul (benchmarks/README.md, "Figures behind
constants and docstrings"). ``create()`` gives each rank ``cores on the node // ranks on the
node`` threads with ``threadpoolctl`` (NumPy has loaded its BLAS already: environment variables
would come too late), unless ``blas_threads`` or ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``
/ ``MKL_NUM_THREADS`` say otherwise. The virtual cluster (threads of one process) is untouched.
"""
import os
from typing import Any, Optional, Set, Tuple

ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

_placed = False  # the default placement happens once per process (communicators may be many)
_ours: Set[str] = set()  # the variables set here, not by the user


def threads_per_rank(cores: int, ranks: int) -> int:
    """Cores on the node divided among its ranks, at least one thread each."""
    return max(1, cores // max(1, ranks))


def user_setting() -> Optional[Tuple[str, str]]:
    """(variable, value) of the first thread-count variable the user set, else None."""
    for var in ENV_VARS:
        if os.environ.get(var, "").strip():
            return var, os.environ[var]
    return None


def node_shape(mpi_comm: Any) -> Tuple[int, int]:
    """(ranks on this node, cores they may run on), collective over ``mpi_comm``."""
    from mpi4py import MPI
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        list(range(os.cpu_count() or 1))  # (no affinity on this platform)
    node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        cpus = node.allgather(mine)
        return node.Get_size(), len(set().union(*cpus))
    finally:
        node.Free()


def limit(n: int) -> None:
    """At most ``n`` threads in every BLAS and OpenMP pool loaded in this process, and (the
    variables the user did not set, set to ``n``) in those loaded later."""
    from threadpoolctl import threadpool_limits
    threadpool_limits(limits=n)
    for var in ENV_VARS:
        if var in _ours or not os.environ.get(var, "").strip():
            os.environ[var] = str(n)
            _ours.add(var)


def place(mpi_comm: Any, blas_threads: Optional[int] = None) -> Optional[str]:
    """Limit this rank's BLAS/OpenMP threads (collective); rank 0 prints the choice, every
    rank returns it (None when nothing was decided: a single rank, or already placed)."""
    global _placed
    if blas_threads is not None and (not isinstance(blas_threads, int)
                                     or isinstance(blas_threads, bool) or blas_threads < 1):
        raise ValueError(f"blas_threads must be a positive int, got {blas_threads!r}")
    ranks, cores = node_shape(mpi_comm)  # every rank calls it: no rank can wait alone
    env = user_setting()
    if blas_threads is not None:
        limit(blas_threads)
        line = f"needle: {blas_threads} BLAS/OpenMP thread(s) per rank (set by the caller)"
    elif _placed or ranks == 1:
        return None
    elif env is not None:
        line = f"needle: BLAS/OpenMP threads left as the environment sets them ({env[0]}={env[1]})"
    else:
        n = threads_per_rank(cores, ranks)
        limit(n)
        line = (f"needle: {ranks} ranks share {cores} core(s) on this node: {n} BLAS/OpenMP "
                f"thread(s) per rank (OMP_NUM_THREADS or create(blas_threads=...) overrides)")
    _placed = True
    if mpi_comm.Get_rank() == 0:
        print(line, flush=True)
    return line

"""Distributed needle: a communicator written from scratch, and the strategies built on it.

``communicator.create()`` under mpiexec, ``virtual.run(4, fn, *args)`` in-process; every strategy
is handed its ``comm``. Importing this package does not start MPI; ``create()`` does, and under
mpiexec installs ``comm.faults.install_exit_guard`` (a rank ending before MPI starts ends the job).
"""
from . import virtual
from .comm import communicator
from .comm.communicator import Communicator, create
from .comm.faults import install_exit_guard
from .comm.ledger import Ledger, Record
from .comm.p2p import ANY_SOURCE, ANY_TAG, P2PStatus
from .comm.progress import CommTimeoutError, DeadlockError, Work
from .comm.protocol import Comm
from .data_parallel import DataParallelNaive, DistributedDataParallel
from .mesh import ProcessMesh
from .param_server import ParameterServer
from .virtual import RankFailedError
from .zero import FullyShardedDataParallel, ZeroRedundancyOptimizer

__all__ = ["ANY_SOURCE", "ANY_TAG", "Comm", "Communicator", "CommTimeoutError", "DataParallelNaive",
           "DeadlockError", "DistributedDataParallel", "FullyShardedDataParallel",
           "ZeroRedundancyOptimizer", "ParameterServer",
           "Ledger", "P2PStatus", "ProcessMesh", "RankFailedError", "Record", "Work",
           "communicator", "create", "virtual"]

install_exit_guard()

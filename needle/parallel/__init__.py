"""Distributed needle: a communicator written from scratch, and the strategies built on it.
Importing does not start MPI: ``communicator.create()`` does (and installs the exit guard)."""
from . import virtual
from .comm import communicator
from .comm.communicator import Communicator, create
from .comm.errors import CommTimeoutError, DeadlockError
from .comm.faults import install_exit_guard
from .comm.ledger import Ledger, Record
from .comm.p2p import ANY_SOURCE, ANY_TAG, P2PStatus
from .comm.progress import Work
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

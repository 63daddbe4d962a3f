"""Distributed needle: a communicator written from scratch, and the strategies built on it.
Importing does not start MPI: ``communicator.create()`` does (and installs the exit guard)."""
from . import virtual
from .comm.engine import communicator
from .comm.engine.communicator import Communicator, create
from .comm.engine.p2p import ANY_SOURCE, ANY_TAG, P2PStatus
from .comm.errors import CommTimeoutError, DeadlockError
from .comm.ledger import Ledger, Record
from .comm.progress import Work
from .comm.protocol import Comm
from .data_parallel import DataParallelNaive, DistributedDataParallel
from .faults import install_exit_guard
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

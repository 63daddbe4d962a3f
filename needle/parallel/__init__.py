"""Distributed needle: a communicator written from scratch, and the strategies built on it.

    from needle.parallel import communicator
    comm = communicator.create()          # under mpiexec; every strategy takes ``comm``

    from needle.parallel import virtual
    virtual.run(4, fn, *args)             # fn(comm, *args) on 4 in-process ranks (no mpiexec)

Layout (one concept per folder; each strategy is handed its communicator explicitly):

* ``comm/``: the communicator, its collectives and their pure reference algorithms, the MPI and
  in-process transports, the communication ledger, and ``Comm``, the type of every ``comm``;
* ``virtual.py``: the in-process virtual cluster (threads, deterministic);
* ``launch.py``: ``python -m needle.parallel.launch -n 4 script.py``;
* ``data_parallel/``, ``zero/``, ``param_server/``: data-parallel training;
* ``tensor_parallel/``, ``pipeline/``, ``moe/``, ``mesh.py``: model-parallel training.

Importing this package does not start MPI; ``communicator.create()`` does.  Under mpiexec it
installs ``comm.faults.install_exit_guard``: a rank that ends before MPI starts ends the job.
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

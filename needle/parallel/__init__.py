"""Distributed needle: a communicator written from scratch, and the strategies built on it.

    from needle.parallel import communicator
    comm = communicator.create()          # under mpiexec; every strategy takes ``comm``

Layout (one concept per folder; each strategy is handed its communicator explicitly):

* ``comm/``: the communicator, its collectives and their pure reference algorithms;
* ``launch.py``: ``python -m needle.parallel.launch -n 4 script.py``;
* ``data_parallel/``, ``zero/``, ``param_server/``: data-parallel training;
* ``tensor_parallel/``, ``pipeline/``, ``moe/``, ``mesh.py``: model-parallel training.

Importing this package does not start MPI; ``communicator.create()`` does.
"""
from .comm import communicator
from .comm.communicator import Communicator, create
from .comm.progress import CommTimeoutError, Work

__all__ = ["Communicator", "CommTimeoutError", "Work", "communicator", "create"]

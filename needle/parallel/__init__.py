"""Distributed needle: collectives written from scratch on MPI point-to-point messages.

Start with ``communicator.create()`` (see ``communicator.py``).  Reading order for students:
``ring.py`` (the algorithms as pure functions over a list of per-rank arrays), ``ring_mpi.py``
and ``tree_mpi.py`` (the same schedules over MPI), ``progress.py`` (waiting, timeouts, async
handles), ``metadata.py`` (argument checks), ``select.py`` (choosing an algorithm),
``launch.py`` and ``bench.py`` (running and measuring).

Importing this package does not start MPI; ``communicator.create()`` does.
"""
from .communicator import Communicator, create
from .progress import CommTimeoutError, Work

__all__ = ["Communicator", "CommTimeoutError", "Work", "create"]

"""The communicator: collectives written from scratch on point-to-point messages.

Reading order: ``reference.py`` (the algorithms as pure functions), ``ring.py`` and
``latency_bound.py`` (the same as generators over messages), ``hierarchical.py``,
``progress.py`` (channels, waiting, ``Work``), ``errors.py``, ``hosts.py`` (which host each
rank is on), ``metadata.py`` (argument checks), ``select.py``, ``p2p.py``, ``ledger.py``, the
transports, ``mpi_runtime.py`` (MPI started on first use) and ``scheduler.py``,
``collectives.py`` (the table) and ``communicator.py`` (the class that runs it).
"""
from .communicator import Communicator, create
from .errors import CommTimeoutError, DeadlockError
from .progress import Work
from .protocol import Comm

__all__ = ["Comm", "Communicator", "CommTimeoutError", "DeadlockError", "Work", "create"]

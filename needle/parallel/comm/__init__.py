"""The communicator: collectives written from scratch on point-to-point messages.

Reading order: ``reference.py`` (every algorithm as a pure function over a list of per-rank
arrays), ``ring.py`` and ``latency_bound.py`` (the same schedules as generators over
point-to-point messages), ``hierarchical.py`` (the allreduce for ranks that share hosts),
``progress.py`` (channels, waiting, async handles), ``metadata.py``
(checking that all ranks passed the same arguments), ``select.py`` (choosing an algorithm),
``p2p.py`` (send/recv), ``ledger.py`` (what every call sent), ``transport_mpi.py`` and
``transport_inprocess.py`` + ``scheduler.py`` (MPI processes or the virtual cluster's threads),
``cost_model.py`` (alpha-beta), ``result_pool.py`` (memory for large results), ``faults.py``
(ending the job when a rank fails), ``convert.py`` (numpy / NDArray / Tensor, the host bridge),
``collectives.py`` (the table of collectives), ``communicator.py``, the class that runs it, and
``protocol.py`` (``Comm``: the type of every strategy's ``comm`` argument).
"""
from .communicator import Communicator, create
from .progress import CommTimeoutError, DeadlockError, Work
from .protocol import Comm

__all__ = ["Comm", "Communicator", "CommTimeoutError", "DeadlockError", "Work", "create"]

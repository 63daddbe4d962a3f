"""The communicator: collectives written from scratch on point-to-point messages.

Reading order: ``reference.py`` (every algorithm as a pure function over a list of per-rank
arrays), ``ring.py`` and ``latency_bound.py`` (the same schedules as generators over
point-to-point messages), ``progress.py`` (waiting, timeouts, async handles), ``metadata.py``
(checking that all ranks passed the same arguments), ``select.py`` (choosing an algorithm),
``faults.py`` (ending the job when a rank fails), ``convert.py`` (numpy / NDArray / Tensor),
and ``communicator.py``, the class that puts them together.
"""
from .communicator import Communicator, create
from .progress import CommTimeoutError, Work

__all__ = ["Communicator", "CommTimeoutError", "Work", "create"]

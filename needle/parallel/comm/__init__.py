"""The communicator: collectives written from scratch on point-to-point messages.

``algorithms/`` (what is sent), ``engine/`` (the ``Communicator`` that runs a call),
``transport/`` (what it travels over); beside them what all three use: ``progress.py``
(channels, waiting, ``Work``), the errors, host discovery, the ledger, the ``Comm`` protocol
and the cross-rank ``agree``.
"""
from .engine.communicator import Communicator, create
from .errors import CommTimeoutError, DeadlockError
from .progress import Work
from .protocol import Comm

__all__ = ["Comm", "Communicator", "CommTimeoutError", "DeadlockError", "Work", "create"]

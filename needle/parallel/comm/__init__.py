"""The communicator: collectives written from scratch on point-to-point messages.

``algorithms/`` (what is sent), ``engine/`` (the ``Communicator`` that runs a call),
``transport/`` (what it travels over); beside them the errors, host discovery, the ledger, the
``Comm`` protocol and the cross-rank ``agree``.
"""
from .engine.communicator import Communicator, create
from .errors import CommTimeoutError, DeadlockError
from .protocol import Comm
from .transport.progress import Work

__all__ = ["Comm", "Communicator", "CommTimeoutError", "DeadlockError", "Work", "create"]

"""What a strategy may ask of the communicator it is handed: the ``Comm`` protocol.

Every strategy takes ``comm: Comm`` as an argument, never a global; mypy checks every call
against it, and ``communicator.Communicator`` (over MPI or in-process) satisfies it with the same
parameters, name for name (``tests/parallel/comm/test_protocol.py``).
"""
from typing import TYPE_CHECKING, Any, ContextManager, Dict, Optional, Protocol, runtime_checkable

import numpy as np

from .ledger import Ledger
from .progress import Stat, Transport, Work

__all__ = ["Comm"]


@runtime_checkable
class Comm(Protocol):
    """A group of ``size`` ranks, this one ``rank``, with collectives and messages."""

    rank: int
    size: int
    timeout: float
    ledger: Ledger  # every call's bytes and label
    stats: Dict[str, Stat]  # per collective: calls, bytes sent and received (progress.py)
    transport: Transport  # what the messages travel over: MPI or the in-process cluster

    def allreduce(self, a: Any, op: str = "sum", algorithm: str = "auto",
                  out: Optional[np.ndarray] = None, label: Optional[str] = None,
                  context: int = 0) -> Any:
        """Reduce ``a`` over all ranks with ``op``; every rank gets the result."""

    def allreduce_async(self, a: Any, op: str = "sum", algorithm: str = "auto",
                        out: Optional[np.ndarray] = None, label: Optional[str] = None,
                        context: int = 0) -> Work:
        """Start an allreduce; a ``Work`` whose ``wait()`` returns the result."""

    def allgather(self, a: Any, algorithm: str = "auto", out: Optional[np.ndarray] = None,
                  label: Optional[str] = None) -> Any:
        """Every rank's ``a`` concatenated along axis 0, on every rank."""

    def allgather_async(self, a: Any, algorithm: str = "auto", out: Optional[np.ndarray] = None,
                        label: Optional[str] = None) -> Work:
        """Start an allgather; a ``Work``."""

    def reduce_scatter(self, a: Any, op: str = "sum", algorithm: str = "auto",
                       out: Optional[np.ndarray] = None, label: Optional[str] = None) -> Any:
        """Reduce ``a`` over all ranks; rank r keeps the r-th equal chunk of axis 0."""

    def reduce_scatter_async(self, a: Any, op: str = "sum", algorithm: str = "auto",
                             out: Optional[np.ndarray] = None,
                             label: Optional[str] = None) -> Work:
        """Start a reduce-scatter; a ``Work``."""

    def broadcast(self, a: Any, root: int = 0, algorithm: str = "auto",
                  out: Optional[np.ndarray] = None, label: Optional[str] = None) -> Any:
        """``root``'s ``a`` on every rank."""

    def reduce(self, a: Any, root: int = 0, op: str = "sum", algorithm: str = "auto",
               label: Optional[str] = None) -> Any:
        """Reduce ``a`` over all ranks onto ``root``."""

    def alltoall(self, a: Any, algorithm: str = "auto", label: Optional[str] = None) -> Any:
        """Chunk j of axis 0 goes to rank j; received chunks concatenated by rank."""

    def reset_stats(self) -> None:
        """Forget the byte and call counters in ``stats``."""

    def barrier(self, label: Optional[str] = None) -> None:
        """Return once every rank has entered."""

    def split(self, color: int, key: int = 0) -> "Comm":
        """The subgroup of the ranks that passed the same ``color``, ordered by ``key``."""

    def region(self, name: str) -> ContextManager[None]:
        """Label the calls made inside (for the ledger and the stats)."""

    def abort(self, code: int = 1) -> None:
        """End the whole job."""

    def send(self, a: Any, dest: int, tag: int = 0, label: Optional[str] = None) -> None:
        """Send ``a`` to rank ``dest``."""

    def isend(self, a: Any, dest: int, tag: int = 0, label: Optional[str] = None) -> Work:
        """Start sending ``a`` to rank ``dest``; a ``Work``."""

    def recv(self, source: int, tag: int = 0, out: Optional[np.ndarray] = None,
             label: Optional[str] = None, return_status: bool = False) -> Any:
        """The next array ``source`` sends here with ``tag``."""

    def irecv(self, source: int, tag: int = 0, out: Optional[np.ndarray] = None,
              label: Optional[str] = None, return_status: bool = False) -> Work:
        """Start receiving from ``source``; a ``Work``."""


if TYPE_CHECKING:  # mypy checks here that the communicator satisfies the protocol
    from .engine.communicator import Communicator

    def _is_comm(c: Communicator) -> Comm:
        return c

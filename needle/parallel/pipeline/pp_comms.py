"""Point-to-point messages between pipeline stages (Megatron's ``p2p_communication.py``):
nonblocking sends, activations forward with tag 1, gradients backward with tag 2."""
from typing import Any, List

import numpy as np

from ..comm.protocol import Comm

__all__ = ["Links", "ACTIVATION", "GRADIENT"]

ACTIVATION, GRADIENT = 1, 2


class Links:
    """This stage's messages to and from the other stages of ``comm``."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm
        self._pending: List[Any] = []

    def send(self, x: np.ndarray, dst: int, tag: int) -> None:
        """Start sending ``x`` to stage ``dst`` (do not modify ``x`` afterwards)."""
        label = "pp.activation" if tag == ACTIVATION else "pp.grad"
        self._pending.append(self.comm.isend(np.ascontiguousarray(x), dst, tag, label=label))

    def recv(self, src: int, tag: int) -> np.ndarray:
        """The next array stage ``src`` sends here with ``tag``."""
        label = "pp.activation" if tag == ACTIVATION else "pp.grad"
        return self.comm.recv(src, tag, label=label)

    def wait_all(self) -> None:
        """Complete every send started so far."""
        for work in self._pending:
            work.wait()
        self._pending.clear()

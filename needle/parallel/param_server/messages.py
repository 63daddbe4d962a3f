"""The parameter server's wire protocol: small int64 headers and array payloads over
point-to-point messages (``comm.send`` / ``comm.irecv``).

    worker -> server, tag REQUEST:  [PULL, key, clock]            -> reply
                                    [PUSH, key, clock] + gradient  (tag PAYLOAD)
                                    [CLOCK, -1, new clock]
                                    [DONE, -1, clock]
    server -> worker, tag REPLY:    [OK, key, clock] + parameter   (tag REPLY_PAYLOAD)
                                    [ERROR, -1, -1] + message as bytes (tag REPLY_PAYLOAD)

Messages between one pair of ranks with one tag arrive in the order sent, so a worker's push
is always seen before its next clock, and a payload right after its header.
"""
from typing import Tuple

import numpy as np

from ..comm.protocol import Comm

__all__ = ["PULL", "PUSH", "CLOCK", "DONE", "OK", "ERROR", "REQUEST", "PAYLOAD", "REPLY",
           "REPLY_PAYLOAD", "header", "send_error", "recv_reply", "ParameterServerError"]

PULL, PUSH, CLOCK, DONE = 1, 2, 3, 4
OK, ERROR = 10, 11
REQUEST, PAYLOAD, REPLY, REPLY_PAYLOAD = 101, 102, 103, 104


class ParameterServerError(RuntimeError):
    """The parameter server stopped training (a missing worker under BSP, a bad push...)."""


def header(op: int, key: int, clock: int) -> np.ndarray:
    """A request or reply header."""
    return np.array([op, key, clock], dtype=np.int64)


def send_error(comm: Comm, worker: int, message: str) -> None:
    """Tell ``worker`` that training failed, and why."""
    comm.send(header(ERROR, -1, -1), worker, REPLY)
    comm.send(np.frombuffer(message.encode(), dtype=np.uint8).copy(), worker, REPLY_PAYLOAD)


def recv_reply(comm: Comm, server: int) -> Tuple[int, np.ndarray]:
    """(server clock, parameter) of a pull's reply; raises the server's error if it failed."""
    h = comm.recv(server, REPLY)
    payload = comm.recv(server, REPLY_PAYLOAD)
    if int(h[0]) == ERROR:
        raise ParameterServerError(bytes(payload).decode())
    return int(h[2]), payload

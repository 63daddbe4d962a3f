"""The server role: apply pushed gradients to its keys and answer pulls when the consistency
model allows; everything is logged (``ServerEvent``), so tests check staleness from the log."""
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from ...autograd import Tensor
from ..comm.engine.convert import host_view, to_tensor
from ..comm.engine.p2p import ANY_SOURCE
from ..comm.protocol import Comm
from .consistency import ClockTable
from .messages import (
    CLOCK,
    DONE,
    OK,
    PAYLOAD,
    PULL,
    PUSH,
    REPLY,
    REPLY_PAYLOAD,
    REQUEST,
    ParameterServerError,
    header,
    send_error,
)

__all__ = ["Server", "ServerEvent"]

POLL_SECONDS = 2e-4  # sleep between empty polls: an idle server must not hold a core


class ServerEvent(NamedTuple):
    """One thing the server did: ``event`` is read, apply, tick, dead, done or error."""

    time: float
    event: str
    worker: int
    key: int
    clock: int
    min_clock: int


class Server:
    """One server rank: the parameters whose keys it owns, their optimizer, the clock table."""

    def __init__(self, comm: Comm, params: Dict[int, Tensor], names: Dict[int, str],
                 workers: List[int], staleness: float, optimizer: Any, timeout: float) -> None:
        self.comm, self.params, self.names = comm, params, names
        self.workers, self.optimizer, self.timeout = workers, optimizer, timeout
        self.table = ClockTable(workers, staleness)
        self.aggregate = staleness == 0  # BSP: one step per iteration on the summed gradient
        self.sums: Dict[Tuple[int, int], Tuple[np.ndarray, int]] = {}
        self.waiting: List[Tuple[int, int, int]] = []  # (worker, key, clock) of queued pulls
        self.last_heard = {w: time.monotonic() for w in workers}
        self.finished: List[int] = []
        self.failure: Optional[str] = None
        self.told: set = set()
        self.log: List[ServerEvent] = []
        self._t0 = time.monotonic()

    def _note(self, event: str, worker: int, key: int = -1, clock: int = -1) -> None:
        self.log.append(ServerEvent(time.monotonic() - self._t0, event, worker, key, clock,
                                    self.table.min_clock()))

    # -- the loop ----------------------------------------------------------------------------
    def serve(self) -> List[ServerEvent]:
        """Answer requests until every worker is done or presumed dead; returns the log."""
        work = None
        while self._active():
            if work is None:
                work = self.comm.irecv(ANY_SOURCE, REQUEST, return_status=True)
            if work.poll():  # a long poll: the silence check below bounds it, not the timeout
                h, status = work.wait()
                work = None
                self.last_heard[status.source] = time.monotonic()
                self._handle(status.source, int(h[0]), int(h[1]), int(h[2]))
            else:
                time.sleep(POLL_SECONDS)
                self._check_silence()
        if self.failure is not None:
            raise ParameterServerError(self.failure)
        return self.log

    def _active(self) -> bool:
        gone = set(self.finished) | set(self.table.dead)
        if self.failure is not None:  # keep answering until every worker knows
            gone |= self.told
        return not set(self.workers) <= gone

    def _handle(self, worker: int, op: int, key: int, clock: int) -> None:
        if op == PUSH:
            grad = self.comm.recv(worker, PAYLOAD)
            if self.failure is None:
                self._push(worker, key, clock, grad)
        elif self.failure is not None:
            if op == PULL or op == CLOCK:
                self._tell(worker)
            if op == DONE:
                self.finished.append(worker)
        elif op == PULL:
            self.waiting.append((worker, key, clock))
        elif op == CLOCK:
            self.table.tick(worker, clock)
            self._note("tick", worker, clock=clock)
        elif op == DONE:
            self.finished.append(worker)
            self.table.remove(worker)
            self._note("done", worker, clock=clock)
        self._grant()

    def _push(self, worker: int, key: int, clock: int, grad: np.ndarray) -> None:
        param = self.params.get(key)
        if param is None or tuple(grad.shape) != tuple(param.shape):
            name = self.names.get(key, f"key {key}")
            want = tuple(param.shape) if param is not None else "no such key on this server"
            self._fail(f"parameter server (rank {self.comm.rank}): worker rank {worker} pushed "
                       f"a gradient of shape {tuple(grad.shape)} for parameter {name!r}, whose "
                       f"shape is {want}")
            return
        if not self.aggregate:  # SSP/ASP: apply now, 1/W of an iteration's step
            self._apply(key, grad / len(self.workers))
            self._note("apply", worker, key, clock)
            return
        total, count = self.sums.get((key, clock), (0, 0))
        total, count = total + grad, count + 1
        if count == len(self.workers) - len(self.table.dead):  # every worker's gradient
            self.sums.pop((key, clock), None)
            self._apply(key, total / count)
            self._note("apply", worker, key, clock)
        else:
            self.sums[(key, clock)] = (total, count)

    def _apply(self, key: int, grad: np.ndarray) -> None:
        """One optimizer step on parameter ``key`` alone (the others have no gradient)."""
        param = self.params[key]
        param.grad = to_tensor(np.ascontiguousarray(grad), param.device, param.dtype)
        self.optimizer.step()
        param.grad = None

    def _grant(self) -> None:
        """Answer every queued pull the clock table now allows."""
        still = []
        for worker, key, clock in self.waiting:
            if self.failure is None and self.table.can_read(clock):
                self.comm.send(header(OK, key, self.table.min_clock()), worker, REPLY)
                self.comm.send(np.ascontiguousarray(host_view(self.params[key])), worker,
                               REPLY_PAYLOAD)
                self._note("read", worker, key, clock)
            else:
                still.append((worker, key, clock))
        self.waiting = still

    # -- failures ----------------------------------------------------------------------------
    def _check_silence(self) -> None:
        """Presume silent workers dead when someone (or the end of training) waits for them."""
        now = time.monotonic()
        blocking = {w for _, _, clock in self.waiting for w in self.table.laggards(clock)}
        if not self.waiting and (self.finished or self.table.dead):
            blocking.update(self.table.clock)  # at the end: the ones that never said DONE
        for w in sorted(blocking):
            if now - self.last_heard[w] > self.timeout and w in self.table.clock:
                if self.aggregate:
                    self.told.add(w)  # it is not listening
                    self._fail(f"parameter server (rank {self.comm.rank}): BSP cannot go on: "
                               f"worker rank {w} sent nothing for {now - self.last_heard[w]:.1f}"
                               f" s (timeout {self.timeout:g} s) and is stuck at clock "
                               f"{self.table.clock[w]}, which every other worker waits for")
                else:
                    self.table.remove(w, dead=True)
                    self._note("dead", w, clock=-1)
                    self._grant()

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message
            self._note("error", -1)
        for worker, _, _ in self.waiting:
            self._tell(worker)
        self.waiting = []
        for w in self.table.dead:
            self.told.add(w)

    def _tell(self, worker: int) -> None:
        assert self.failure is not None  # only told after _fail
        if worker not in self.told:
            self.told.add(worker)
            send_error(self.comm, worker, self.failure)

    def __repr__(self) -> str:
        return f"Server(rank {self.comm.rank}, {len(self.params)} keys, clocks {self.table.clock})"

"""Cooperative scheduling of the virtual cluster's rank threads: one baton, deadlock detection.

One rank thread runs at a time, the one holding the *baton*; it passes it round-robin only when
a poll finds nothing, so message order and results are the same on every run. Each pair of
``state`` hooks (numpy's RNG, grad mode, ...) is saved when the baton leaves a rank and restored
when it returns. A waiting rank records the *epoch* (bumped by every delivery and every rank
that ends); when every live rank waits at the current epoch, all raise ``DeadlockError``.
"""
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import DeadlockError

StateHooks = Sequence[Tuple[Callable[[], Any], Callable[[Any], None]]]


class CommAbortedError(RuntimeError):
    """A rank of the virtual cluster called ``comm.abort()``."""


class Scheduler:
    """The baton of ``size`` rank threads, their saved state and what each one waits for."""

    def __init__(self, size: int, state: StateHooks) -> None:
        self.size = size
        self._state = list(state)
        self._gates = [threading.Lock() for _ in range(size)]
        for gate in self._gates:
            gate.acquire()  # a rank runs only once its gate is released
        self._saved: List[List[Any]] = [self.snapshot()] * size  # all start from the caller's
        self.live = [True] * size
        self.epoch = 0
        self._blocked: List[Optional[int]] = [None] * size
        self._pending: List[Optional[Callable[[], str]]] = [None] * size
        self._doomed: Dict[int, str] = {}
        self.errors: Dict[int, BaseException] = {}
        self.failure_order: List[int] = []
        self.aborted: Optional[Tuple[int, int]] = None
        self.done = threading.Event()
        self._alone_since: Dict[int, float] = {}

    def snapshot(self) -> List[Any]:
        """The current value of every registered piece of process-global state."""
        return [get() for get, _ in self._state]

    def restore(self, values: List[Any]) -> None:
        """Set every registered piece of process-global state."""
        for (_, set_), value in zip(self._state, values):
            set_(value)

    def begin(self) -> None:
        """From the caller: give the baton to rank 0."""
        self._gates[0].release()

    def enter(self, r: int) -> None:
        """First call of rank ``r``'s thread: wait for the baton."""
        self._gates[r].acquire()
        self.restore(self._saved[r])
        self._check(r)

    def _next(self, r: int) -> Optional[int]:
        for k in range(1, self.size + 1):
            q = (r + k) % self.size
            if self.live[q]:
                return q
        return None

    def _switch(self, r: int) -> None:
        q = self._next(r)
        if q is None or q == r:
            return
        self._saved[r] = self.snapshot()
        self._gates[q].release()
        self._gates[r].acquire()
        self.restore(self._saved[r])

    def block(self, r: int, describe: Callable[[], str]) -> None:
        """Rank ``r`` waits and its poll found nothing: run the others, or raise on deadlock."""
        self._blocked[r], self._pending[r] = self.epoch, describe
        if all(self._blocked[q] == self.epoch for q in range(self.size) if self.live[q]):
            message = self._deadlock_message()
            for q in range(self.size):
                if self.live[q] and q != r:
                    self._doomed[q] = message  # raises when it next runs: no longer waiting
                    self._blocked[q] = None
            self._blocked[r] = None
            raise DeadlockError(message)
        self._switch(r)
        self._blocked[r] = None
        self._check(r)

    def pause(self, r: int, timeout: float = float("inf")) -> None:
        """Rank ``r`` tested and found nothing but is not blocked: let the others run; raise
        ``DeadlockError`` once it has polled alone (every other rank ended) for ``timeout``."""
        if self.size > 1 and not any(self.live[q] for q in range(self.size) if q != r):
            since = self._alone_since.setdefault(r, time.monotonic())
            if time.monotonic() - since > timeout:
                self._pending[r] = None
                raise DeadlockError(self._deadlock_message().replace(
                    "every live rank waits and no message can arrive", f"rank {r} polled a "
                    f"call for {timeout:g} s after every other rank ended", 1))
        self._switch(r)
        self._check(r)

    def delivered(self) -> None:
        """A message was delivered: waiting ranks may now make progress."""
        self.epoch += 1

    def finish(self, r: int, error: Optional[BaseException] = None) -> None:
        """Rank ``r``'s function returned (or raised): pass the baton on for good."""
        self.live[r] = False
        self._blocked[r] = None
        if error is not None:
            self.errors[r] = error
            self.failure_order.append(r)
        self.epoch += 1
        q = self._next(r)
        if q is None:
            self.done.set()
        else:
            self._gates[q].release()

    def abort(self, r: int, code: int) -> None:
        """Rank ``r`` called ``abort(code)``: every other rank raises when it next runs."""
        if self.aborted is None:
            self.aborted = (r, code)
        raise CommAbortedError(f"rank {r} called abort({code})")

    def _check(self, r: int) -> None:
        if r in self._doomed:
            raise DeadlockError(self._doomed.pop(r))
        if self.aborted is not None:
            raise CommAbortedError(f"rank {self.aborted[0]} called abort({self.aborted[1]})")

    def _deadlock_message(self) -> str:
        lines = []
        for q in range(self.size):
            if q in self.errors:
                err = self.errors[q]
                lines.append(f"rank {q}: failed with {type(err).__name__}: {err}")
            elif not self.live[q]:
                lines.append(f"rank {q}: finished")
            else:
                describe = self._pending[q]
                what = getattr(describe, "what", None)
                doing = what() if what else describe() if describe else "a nonblocking call"
                lines.append(f"rank {q}: waits in {doing}")
        return ("needle.parallel.virtual: deadlock, every live rank waits and no message can "
                "arrive:\n  " + "\n  ".join(lines))

"""Reduce while backward runs: a hook per gradient, and one callback when backward ends.

Li et al., "PyTorch Distributed" (VLDB 2020), sec. 3.2.3: DDP registers an autograd hook on
every parameter, so each gradient is handed to its bucket the moment it is accumulated, and the
reducer waits for its collectives only once the whole backward is done. DDP, ZeRO-2 and FSDP
all follow that pattern; ``BackwardHooks`` is it, written once: ``on_grad(param)`` runs for each
gradient, and the first gradient of a backward queues ``on_end()`` for the end of that backward
(``autograd.queue_callback``).
"""
from typing import Callable, Iterable

from ... import autograd
from ...autograd import Tensor

__all__ = ["BackwardHooks"]


class BackwardHooks:
    """``on_grad`` per accumulated gradient of ``params``; ``on_end`` once per backward."""

    def __init__(self, params: Iterable[Tensor], on_grad: Callable[[Tensor], None],
                 on_end: Callable[[], None]) -> None:
        self._on_grad, self._on_end = on_grad, on_end
        self.queued = False  # on_end is queued for the backward now running
        for p in params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, param: Tensor) -> None:
        if not self.queued:  # the first gradient of this backward
            self.queued = True
            autograd.queue_callback(self._end)
        self._on_grad(param)

    def _end(self) -> None:
        self.queued = False
        self._on_end()

    def interrupted(self) -> bool:
        """True if the last backward raised before its end (the hooks are re-armed)."""
        was, self.queued = self.queued, False
        return was

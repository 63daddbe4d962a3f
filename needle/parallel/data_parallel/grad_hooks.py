"""Reduce while backward runs: a hook per gradient, and one callback when backward ends
(Li et al., VLDB 2020, sec. 3.2.3); written once for DDP, ZeRO-2 and FSDP."""
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

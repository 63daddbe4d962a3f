"""CPU offload of optimizer state (ZeRO-Offload, arXiv:2101.06840, sec. 4): state and step on
the host, two transfers of the model per step."""
from typing import Any, Iterable, List, Optional, Type

from ..autograd import Tensor
from ..backend_ndarray import BackendDevice, cpu
from ..optim.optimizer import unique_by_identity

__all__ = ["OffloadOptimizer"]


class OffloadOptimizer:
    """Wrap ``optimizer_cls`` so that its state and update stay on ``host`` (the CPU)."""

    def __init__(self, optimizer_cls: Type[Any], params: Iterable[Tensor],
                 host: Optional[BackendDevice] = None, **kwargs: Any) -> None:
        self.params: List[Tensor] = unique_by_identity(params)
        self.host = host if host is not None else cpu()
        self.host_params = [Tensor(p.realize_cached_data().numpy(), device=self.host,
                                   dtype=p.dtype) for p in self.params]
        self.inner = optimizer_cls(self.host_params, **kwargs)

    def __getattr__(self, name: str) -> Any:  # lr, state, ... of the wrapped optimizer
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "lr" and "inner" in self.__dict__:
            self.inner.lr = value  # schedulers set optimizer.lr
        else:
            object.__setattr__(self, name, value)

    def step(self) -> None:
        """Gradients to the host, the wrapped step there, updated weights back to the device."""
        for p, h in zip(self.params, self.host_params):
            if p.grad is None:
                h.grad = None
                continue
            g = p.grad.realize_cached_data()
            h.grad = Tensor.make_const(g if g.device == self.host else g.to(self.host))
        self.inner.step()
        for p, h in zip(self.params, self.host_params):
            if p.grad is not None:
                w = h.realize_cached_data()
                p.cached_data = w.to(p.device) if w.device != p.device else w + 0

    def reset_grad(self) -> None:
        """Drop the device gradients."""
        for p in self.params:
            p.grad = None

    zero_grad = reset_grad

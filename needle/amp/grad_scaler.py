"""Dynamic loss scaling (Micikevicius et al., arXiv:1710.03740, sec. 3.2); torch.cuda.amp's API:
a step with inf/nan gradients is skipped and the scale halved; clean steps grow it back."""
from typing import Any, Dict, List, Optional

from .. import numbers
from ..autograd import Tensor

__all__ = ["GradScaler"]


def _params_with_grad(optimizer: Any) -> List[Tensor]:
    params = getattr(optimizer, "params", None)
    if params is None:
        raise TypeError(f"GradScaler needs an optimizer with .params, got "
                        f"{type(optimizer).__name__}")
    return [p for p in params if p.grad is not None]


class GradScaler:
    """Scale the loss, unscale and check the gradients, skip bad steps, adapt the scale."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True):
        # nan passed the comparisons (a nan scale made every step look overflowed and skipped)
        self.scale_value = numbers.real_arg(init_scale, "GradScaler: init_scale", lo=0,
                                            lo_open=True)
        self.growth_factor = numbers.real_arg(growth_factor, "GradScaler: growth_factor", lo=1,
                                              lo_open=True)
        self.backoff_factor = numbers.real_arg(backoff_factor, "GradScaler: backoff_factor",
                                               lo=0, hi=1, lo_open=True, hi_open=True)
        self.growth_interval = numbers.count_arg(growth_interval, "GradScaler: growth_interval",
                                                 lo=1)
        self.enabled = enabled
        self.growth_tracker = 0
        self.found_inf: Optional[bool] = None
        self._unscaled = False

    def get_scale(self) -> float:
        """The current loss scale S."""
        return self.scale_value

    def scale(self, loss: Tensor) -> Tensor:
        """loss * S (its backward gives S times the gradients)."""
        if not self.enabled:
            return loss
        return loss * self.scale_value

    def unscale_(self, optimizer: Any) -> bool:
        """Divide the gradients by S in place; return True when any is inf or nan."""
        if not self.enabled:
            return False
        if self._unscaled:
            raise RuntimeError("unscale_() was already called since the last update()")
        inv = 1.0 / self.scale_value
        found = False
        for p in _params_with_grad(optimizer):
            g = p.grad.realize_cached_data()
            if g.dtype != "float32":
                g = g.astype("float32")
            g = g * inv
            # x - x is nan exactly for inf and nan entries: one scalar per tensor to the host
            if float((g - g).sum().numpy()) != 0.0:
                found = True
            p.grad = Tensor.make_const(g)
        self.found_inf = found
        self._unscaled = True
        return found

    def step(self, optimizer: Any) -> bool:
        """Unscale (unless done) and step, unless a gradient overflowed; True when it stepped."""
        if not self.enabled:
            optimizer.step()
            return True
        if not self._unscaled:
            self.unscale_(optimizer)
        if self.found_inf:
            return False
        optimizer.step()
        return True

    def update(self) -> None:
        """Back off after an overflow, grow after ``growth_interval`` clean steps."""
        if not self.enabled:
            return
        if self.found_inf is None:
            raise RuntimeError("update() needs a step() (or unscale_()) first")
        if self.found_inf:
            self.scale_value *= self.backoff_factor
            self.growth_tracker = 0
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.scale_value *= self.growth_factor
                self.growth_tracker = 0
        self.found_inf = None
        self._unscaled = False

    def state_dict(self) -> Dict[str, Any]:
        """Scale and growth counter."""
        return {"scale": self.scale_value, "growth_tracker": self.growth_tracker}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore ``state_dict``."""
        self.scale_value = float(state["scale"])
        self.growth_tracker = int(state["growth_tracker"])

"""Learning-rate schedules: pure functions of the step count; ``step()`` writes ``optimizer.lr``.
They compose: ``LinearWarmup(opt, 100, after=CosineAnnealing(opt, 1000))``."""
import math
from typing import Any, Dict, Optional

from .. import numbers


class LRScheduler:
    """Base class: ``get_lr(step)`` is the learning rate after ``step`` scheduler steps."""

    def __init__(self, optimizer: Any) -> None:
        if not hasattr(optimizer, "lr"):
            raise TypeError(f"{type(self).__name__} schedules an optimizer's lr, got "
                            f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        self.base_lr = optimizer.lr
        self.last_step = 0
        optimizer.lr = self.get_lr(0)

    def get_lr(self, step: int) -> float:
        """The learning rate at ``step``."""
        raise NotImplementedError()

    def step(self) -> float:
        """Advance one step and set the optimizer's lr; returns the new lr."""
        self.last_step += 1
        self.optimizer.lr = self.get_lr(self.last_step)
        return self.optimizer.lr

    def state_dict(self) -> Dict[str, Any]:
        """The step count and base lr."""
        return {"last_step": self.last_step, "base_lr": self.base_lr}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore ``state_dict`` and reapply the lr of that step."""
        self.last_step = numbers.count(state["last_step"], "scheduler state last_step", lo=0)
        self.base_lr = numbers.real(state["base_lr"], "scheduler state base_lr", lo=0)
        self.optimizer.lr = self.get_lr(self.last_step)


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (step // step_size)."""

    def __init__(self, optimizer: Any, step_size: int, gamma: float = 0.1) -> None:
        self.step_size = numbers.count(step_size, "StepLR: step_size", lo=1)
        self.gamma = numbers.real(gamma, "StepLR: gamma", lo=0)
        super().__init__(optimizer)

    def get_lr(self, step: int) -> float:
        return self.base_lr * self.gamma ** (step // self.step_size)


class CosineAnnealing(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) (1 + cos(pi min(step, T_max) / T_max)) / 2 (SGDR)."""

    def __init__(self, optimizer: Any, T_max: int, eta_min: float = 0.0) -> None:
        self.T_max = numbers.count(T_max, "CosineAnnealing: T_max", lo=1)
        self.eta_min = numbers.real(eta_min, "CosineAnnealing: eta_min", lo=0)
        super().__init__(optimizer)

    def get_lr(self, step: int) -> float:
        frac = min(step, self.T_max) / self.T_max
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * frac)) / 2


class LinearWarmup(LRScheduler):
    """lr = base_lr * (step + 1) / warmup_steps, then ``after`` (another schedule, seeing step -
    warmup_steps) or base_lr."""

    def __init__(self, optimizer: Any, warmup_steps: int,
                 after: Optional[LRScheduler] = None) -> None:
        warmup_steps = numbers.count(warmup_steps, "LinearWarmup: warmup_steps", lo=1)
        if after is not None and after.optimizer is not optimizer:
            raise ValueError("LinearWarmup: `after` must schedule the same optimizer")
        self.warmup_steps = warmup_steps
        self.after = after
        if after is not None:
            optimizer.lr = after.base_lr  # `after` already applied its step-0 lr
        super().__init__(optimizer)

    def get_lr(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.base_lr * (step + 1) / self.warmup_steps
        if self.after is not None:
            return self.after.get_lr(step - self.warmup_steps)
        return self.base_lr

"""Learning-rate schedules: pure functions of the step count; ``step()`` writes ``optimizer.lr``.
They compose: ``LinearWarmup(opt, 100, after=CosineAnnealing(opt, 1000))``."""
import math
from typing import Any, Dict, Optional


class LRScheduler:
    """Base class: ``get_lr(step)`` is the learning rate after ``step`` scheduler steps."""

    def __init__(self, optimizer: Any) -> None:
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
        self.last_step = int(state["last_step"])
        self.base_lr = float(state["base_lr"])
        self.optimizer.lr = self.get_lr(self.last_step)


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (step // step_size)."""

    def __init__(self, optimizer: Any, step_size: int, gamma: float = 0.1) -> None:
        if step_size < 1:
            raise ValueError(f"StepLR: step_size must be >= 1, got {step_size}")
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer)

    def get_lr(self, step: int) -> float:
        return self.base_lr * self.gamma ** (step // self.step_size)


class CosineAnnealing(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) (1 + cos(pi min(step, T_max) / T_max)) / 2 (SGDR)."""

    def __init__(self, optimizer: Any, T_max: int, eta_min: float = 0.0) -> None:
        if T_max < 1:
            raise ValueError(f"CosineAnnealing: T_max must be >= 1, got {T_max}")
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer)

    def get_lr(self, step: int) -> float:
        frac = min(step, self.T_max) / self.T_max
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * frac)) / 2


class LinearWarmup(LRScheduler):
    """lr = base_lr * (step + 1) / warmup_steps, then ``after`` (another schedule, seeing step -
    warmup_steps) or base_lr."""

    def __init__(self, optimizer: Any, warmup_steps: int,
                 after: Optional[LRScheduler] = None) -> None:
        if warmup_steps < 1:
            raise ValueError(f"LinearWarmup: warmup_steps must be >= 1, got {warmup_steps}")
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

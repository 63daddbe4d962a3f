"""Optimizers, gradient clipping and learning-rate schedules (``needle.optim``)."""
from .optimizer import SGD, Adam, AdamW, Optimizer  # noqa: F401
from .clip_grad import clip_grad_norm, clip_grad_norm_, grad_norm  # noqa: F401
from .lr_scheduler import CosineAnnealing, LinearWarmup, LRScheduler, StepLR  # noqa: F401
from ..optim_adafactor import Adafactor  # noqa: F401,E402  (needle.memory owner)

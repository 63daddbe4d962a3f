"""Optimizers, gradient clipping and learning-rate schedules (``needle.optim``)."""
from .adafactor import Adafactor
from .clip_grad import clip_grad_norm, clip_grad_norm_, grad_norm
from .lr_scheduler import CosineAnnealing, LinearWarmup, LRScheduler, StepLR
from .optimizer import SGD, Adam, AdamW, Optimizer

"""Mixed-precision training: ``autocast`` and dynamic loss scaling with ``GradScaler``."""
from .autocast import FLOAT32, LOW_PRECISION, NARROWING, autocast, autocast_dtype, policy
from .grad_scaler import GradScaler

"""needle: a small, readable deep learning systems framework (CMU 10-414/714 style)."""
from . import autograd, backend_ndarray, data, init, metrics, nn, ops, optim, profiler, quant
from .autograd import (
    Tensor,
    TensorTuple,
    Value,
    enable_grad,
    from_dlpack,
    is_grad_enabled,
    no_grad,
)
from .backend_ndarray import (
    BackendDevice,
    NDArray,
    all_devices,
    cpu,
    cpu_numpy,
    cuda,
    default_device,
)
from .compiler import compile, lazy
from .ops import *
from .serialization import load, random_state, save, set_random_state

__version__ = "0.1.0"

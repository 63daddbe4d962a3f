"""needle: a small, readable deep learning systems framework (CMU 10-414/714 style)."""
# backend_cuda registers the "cuda" device kind with backend_ndarray (cheap: CuPy loads on the
# first cuda()), so the array layer need not know it
from . import (
    autograd,
    backend_cuda,
    backend_ndarray,
    data,
    init,
    metrics,
    nn,
    ops,
    optim,
    profiler,
    quant,
)
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

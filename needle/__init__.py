"""needle: a small, readable deep learning systems framework (CMU 10-414/714 style)."""
from . import backend_ndarray  # noqa: F401
from .backend_ndarray import (BackendDevice, NDArray, all_devices, cpu,  # noqa: F401
                              cpu_numpy, cuda, default_device)
from . import autograd  # noqa: F401
from .autograd import (Tensor, TensorTuple, Value, enable_grad, is_grad_enabled,  # noqa: F401
                       no_grad)
from . import ops  # noqa: F401
from .ops import *  # noqa: F401,F403
from . import init  # noqa: F401
from . import nn  # noqa: F401
from . import optim  # noqa: F401
from . import data  # noqa: F401
from .serialization import load, random_state, save, set_random_state  # noqa: F401

__version__ = "0.1.0"

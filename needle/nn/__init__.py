"""Neural-network layers (``needle.nn``), with the course's names and constructor arguments."""
from .nn_module import LoadResult, Module, Parameter  # noqa: F401
from .nn_basic import *  # noqa: F401,F403
from .nn_conv import *  # noqa: F401,F403
from .nn_sequence import *  # noqa: F401,F403
from .nn_transformer import *  # noqa: F401,F403
from .nn_lora import *  # noqa: F401,F403

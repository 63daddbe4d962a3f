"""Neural-network layers (``needle.nn``), with the course's names and constructor arguments."""
from .nn_basic import *
from .nn_conv import *
from .nn_lora import *
from .nn_module import LoadResult, Module, Parameter
from .nn_moe import *
from .nn_sequence import *
from .nn_transformer import *

"""needle's operators: each a TensorOp (compute on NDArrays, gradient in Tensor ops)."""
from .ops_conv import *
from .ops_dropout import *
from .ops_indexing import *
from .ops_logarithmic import *
from .ops_mathematic import *
from .ops_norm import *
from .ops_reduce import *
from .ops_tuple import *

"""needle's operators: each a TensorOp (compute on NDArrays, gradient in Tensor ops)."""
from .ops_mathematic import *  # noqa: F401,F403
from .ops_logarithmic import *  # noqa: F401,F403
from .ops_tuple import *  # noqa: F401,F403
from .ops_conv import *  # noqa: F401,F403
from .ops_indexing import *  # noqa: F401,F403
from .ops_reduce import *  # noqa: F401,F403
from .ops_norm import *  # noqa: F401,F403

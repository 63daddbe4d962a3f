"""``autocast``: run matmul/conv in float16 or bfloat16, precision-sensitive ops in float32.

Micikevicius et al., "Mixed Precision Training" (arXiv:1710.03740). Inside ``autocast(dtype)``
every TensorOp call passes through ``policy(op, args)``, which inserts ``Cast`` nodes as
torch.autocast does: ``LOW_PRECISION`` ops cast float32 inputs down, ``FLOAT32`` ops (reductions,
softmax, exp, log, powers) cast low-precision inputs up, and mixed elementwise ops run in
``dtype`` (so ``x @ W + b`` stays half). Parameters and their gradients stay float32.
"""
from typing import Any, Optional, Tuple

from .. import autograd
from ..autograd import Tensor
from ..backend_ndarray import to_numpy_dtype
from ..ops import ops_conv, ops_logarithmic, ops_mathematic, ops_reduce
from ..process_state import switches

__all__ = ["autocast", "autocast_dtype", "policy", "LOW_PRECISION", "FLOAT32", "NARROWING"]

LOW_PRECISION = (ops_mathematic.MatMul, ops_conv.Conv)
FLOAT32 = (ops_reduce.Summation, ops_logarithmic.LogSumExp, ops_logarithmic.LogSoftmax,
           ops_logarithmic.Softmax, ops_mathematic.Exp, ops_mathematic.Log,
           ops_mathematic.EWisePow, ops_mathematic.PowerScalar, ops_reduce.Max)
NARROWING = (ops_mathematic.EWiseAdd, ops_mathematic.EWiseMul, ops_mathematic.EWiseDiv,
             ops_mathematic.Maximum, ops_mathematic.Where)


def autocast_dtype() -> Optional[str]:
    """The active autocast dtype, or None outside ``autocast``."""
    return switches.autocast_dtype


def _cast_all(args: Tuple[Any, ...], src: Tuple[str, ...], dst: str) -> Tuple[Any, ...]:
    out = []
    for a in args:
        if isinstance(a, Tensor) and a.dtype in src and a.dtype != dst:
            if isinstance(a.op, ops_mathematic.BroadcastTo):
                # cast the small source, not the broadcast view (no full-size copy is kept)
                a = ops_mathematic.broadcast_to(ops_mathematic.Cast(dst)(a.inputs[0]), a.shape)
            else:
                a = ops_mathematic.Cast(dst)(a)
        out.append(a)
    return tuple(out)


def policy(op: Any, args: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """The inputs ``op`` should see under the active autocast dtype."""
    low = switches.autocast_dtype
    if low is None or isinstance(op, ops_mathematic.Cast):
        return args
    if isinstance(op, LOW_PRECISION):
        return _cast_all(args, ("float32",), low)
    if isinstance(op, FLOAT32):
        return _cast_all(args, ("float16", "bfloat16"), "float32")
    if isinstance(op, NARROWING) and len(args) == 2:
        dtypes = {a.dtype for a in args if isinstance(a, Tensor)}
        if low in dtypes and "float32" in dtypes:
            return _cast_all(args, ("float32",), low)
    return args


class autocast(autograd.ModeContext):
    """Context manager (and decorator): mixed-precision forward in ``dtype``."""

    def __init__(self, dtype: str = "float16", enabled: bool = True):
        name = to_numpy_dtype(dtype).name
        if name not in ("float16", "bfloat16"):
            raise ValueError(f"autocast dtype must be float16 or bfloat16, got {dtype!r}")
        self.dtype = name
        self.enabled = enabled

    def __enter__(self) -> "autocast":
        self._prev = (switches.autocast_dtype, switches.autocast_hook)
        mode = (self.dtype, policy) if self.enabled else (None, None)
        switches.autocast_dtype, switches.autocast_hook = mode
        return self

    def __exit__(self, *exc: Any) -> None:
        switches.autocast_dtype, switches.autocast_hook = self._prev
